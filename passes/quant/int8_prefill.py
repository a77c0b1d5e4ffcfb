"""int8_prefill: a second graph of the INT4 LLM for prompts, whose linears are int8 GEMMs, over the same KV cache.

An INT4 LLM decodes fast on a CPU (it reads a quarter of fp32's bytes per token), but its prompt runs MatMulNBits at
about the fp32 GEMM's speed, and a prompt of thousands of image tokens is most of the time to the first token. This
pass adds a component `llm_prefill`: the LLM graph as the earlier passes left it, each INT4 linear replaced by a
per-token int8 product of its own dequantized weights, smoothed on calibration data (mmtrt/quant/prefill_int8.py).
The manifest's `model.prefill` tells the runtime to run calls of at least `min_tokens` new tokens with it; both
graphs read and write the one static KV buffer. It needs the static KV layout, and comes after every pass that
rewrites the LLM, since it copies the graph they made.
"""

from __future__ import annotations

import fnmatch
from functools import partial
from typing import Any, Callable

import numpy as np
import onnx

from mmtrt.errors import UserError
from mmtrt.ir import spill
from mmtrt.ir.graph import Component, ModelIR
from mmtrt.ir.logits import LOGITS_FROM
from mmtrt.pipeline.pass_base import Pass
from mmtrt.quant.calibration import calibration_batches
from mmtrt.quant.channel_maxima import channel_maxima
from mmtrt.quant.prefill_int8 import int4_units, prefill_graph, searched_alpha
from passes.quant.int8_prefill_config import Int8PrefillConfig

PREFILL = "llm_prefill"
# its int8 products are ONNX Runtime's, and the runtime binds the KV buffers into ONNX Runtime sessions
ON_ONNXRUNTIME = {"targeted": False, "min_segment_size": 1, "backends": ["onnxruntime"]}
# the calibration prompts the search of a runs seven prompt graphs on
SEARCH_PROMPTS = 4


class Int8Prefill(Pass):
    name = "int8_prefill"
    Config = Int8PrefillConfig
    components = ("llm",)
    requires = frozenset({"kv_layout"})
    seals = frozenset({"llm"})
    lossy = True

    def plan_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        if facts.get("kv_cache", {}).get("layout") != "static":
            raise UserError("int8_prefill runs prompts in a second graph over the static KV buffer; use kv_layout: "
                            "{layout: static} before it")
        return {**facts, "prefill": runtime_config(self.config)}

    def run(self, ir: ModelIR) -> dict[str, Any]:
        cfg, llm = self.config, ir.components["llm"]
        units = [u for u in int4_units(llm.onnx) if self._selected(u.name)]
        if not units:
            raise UserError("int8_prefill found no INT4 linears to run in int8 (it reads awq_int4's MatMulNBits); put "
                            "awq_int4 before it, or check its exclude patterns")
        x_max, alpha, search = self._smoothing(ir, sorted({u.input for u in units}))
        graph, report = prefill_graph(llm.onnx, self._selected, x_max, alpha, self._float_channels,
                                      partial(spill.made, llm.onnx))
        if search:  # each a's squared error in the last hidden states, over the chosen a's
            report["smoothing_search"] = {str(a): round(e / min(search.values()), 4) for a, e in search.items()}
        prefill = Component(PREFILL, [], [], metadata={"placement": dict(ON_ONNXRUNTIME)})
        prefill.set_graph(graph)
        ir.components[PREFILL] = prefill
        ir.config["prefill"] = runtime_config(cfg)
        return {"llm": {**report, "min_tokens": cfg.min_tokens}}

    def _smoothing(self, ir: ModelIR, inputs: list[str]) -> tuple[dict | None, float | None, dict]:
        """The channel maxima of the linears' `inputs` on the calibration data, the a, and the search's errors."""
        smoothing = self.config.smoothing
        if smoothing is None and not self.config.float_channels:
            return None, None, {}
        llm = ir.components["llm"].onnx
        feeds = calibration_feeds(ir, self.config.calibration)
        if smoothing != "search":
            return channel_maxima(llm, inputs, feeds), smoothing, {}
        return search_smoothing(llm, self._selected, inputs, feeds, self._float_channels)

    def _selected(self, name: str) -> bool:
        return not any(_matches(name, p) for p in self.config.exclude)

    def _float_channels(self, name: str) -> int:
        return max((n for p, n in self.config.float_channels.items() if _matches(name, p)), default=0)


def _matches(name: str, pattern: str) -> bool:
    """Whether any part of a linear's name (a fused one is its parts joined by "+") matches the glob `pattern`."""
    return any(fnmatch.fnmatchcase(part, pattern) for part in name.split("+"))


def runtime_config(config: Int8PrefillConfig) -> dict[str, Any]:
    """What the runtime reads from the manifest's model.prefill."""
    return {"component": PREFILL, "min_tokens": config.min_tokens}


def calibration_feeds(ir: ModelIR, cal) -> list[dict[str, np.ndarray]]:
    """The calibration prompts as the static LLM graph's feeds."""
    llm = ir.components["llm"]
    batches = calibration_batches(ir, cal.images, cal.samples, cal.text_windows, cal.text)
    empty: dict[tuple, np.ndarray] = {}
    return [static_feeds(llm, b, empty) for b in batches.llm]


def search_smoothing(model: onnx.ModelProto, select: Callable[[str], bool], inputs: list[str],
                     feeds: list[dict[str, np.ndarray]], float_channels: Callable[[str], int] = lambda name: 0
                     ) -> tuple[dict, float, dict]:
    """The channel maxima of `inputs` over every prompt of `feeds`, the searched a, and each a's error. The search
    scores the a on its first prompts (at most SEARCH_PROMPTS, and half) with the maxima of the others: scored on
    the prompts its maxima came from, it favoured a larger a than fresh prompts do."""
    if len(feeds) < 2:
        raise UserError("int8_prefill's smoothing: search needs at least 2 calibration prompts (its maxima come from "
                        "some, its score from others); raise calibration.samples or calibration.text_windows")
    scored = min(SEARCH_PROMPTS, len(feeds) // 2)
    first, rest = channel_maxima(model, inputs, feeds[:scored]), channel_maxima(model, inputs, feeds[scored:])
    alpha, errors = searched_alpha(model, select, rest, feeds[:scored], float_channels)
    return {name: np.maximum(first[name], rest[name]) for name in inputs}, alpha, errors


def static_feeds(llm: Component, feeds: dict[str, np.ndarray], empty: dict[tuple, np.ndarray] | None = None
                 ) -> dict[str, np.ndarray]:
    """A calibration batch, made for the exported graph, as the static layout's inputs: empty buffers as long as
    the sequences, the logits of the last position only. The graph only reads the buffers (its writes are outputs
    of their own here), so every layer's, and every batch's of one shape, is one read-only array of zeros from
    `empty` ({(shape, dtype): array}): one per layer and prompt held 0.8 GB at LLaVA-OneVision-0.5B's size (24
    layers' keys and values for each of 16 prompts of 2,000-odd tokens)."""
    empty = {} if empty is None else empty
    batch, seq = feeds["inputs_embeds"].shape[:2]
    specs = {s.name: s for s in llm.inputs}
    out = {"inputs_embeds": feeds["inputs_embeds"].astype(specs["inputs_embeds"].dtype),
           "position_ids": feeds["position_ids"], "seqlens_k": np.full(batch, seq - 1, np.int32),
           "total_sequence_length": np.array(seq, np.int32), LOGITS_FROM: np.array([seq - 1], np.int64)}
    for name, spec in specs.items():
        if name.startswith("past."):
            key = ((batch, spec.shape[1], seq, spec.shape[3]), np.dtype(spec.dtype))
            if key not in empty:
                empty[key] = np.zeros(*key)
                empty[key].setflags(write=False)
            out[name] = empty[key]
    return out
