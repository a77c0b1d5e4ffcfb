"""What every family shares: the LLM's facts, the tokenizer assets, and the embed and llm components."""

from __future__ import annotations

import contextlib
import gc
import itertools
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import onnx
import torch

from mmtrt.ir import export, source_weights
from mmtrt.ir.graph import Component, graph_io
from mmtrt.progress import facts_digest, stage

COMPONENTS = ("preprocess", "vision", "embed", "llm")
# what every family's lowering gives: HF's stack of all vision hidden states, the LLM's cache as HF lays it out
FRONTEND_PROPERTIES = frozenset({"vision.hidden_state_stack", "llm.kv_cache.hf"})


def llm_facts(text) -> dict[str, Any]:
    """The decoder's sizes, from its text config, and whether its lm_head shares the embedding table."""
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return {
        "model_type": text.model_type,
        "num_layers": text.num_hidden_layers,
        "hidden_size": text.hidden_size,
        "num_heads": text.num_attention_heads,
        "num_kv_heads": text.num_key_value_heads,
        "head_dim": head_dim,
        "vocab_size": text.vocab_size,
        "max_position_embeddings": text.max_position_embeddings,
        "tie_word_embeddings": bool(getattr(text, "tie_word_embeddings", False)),
    }


def eos_token_ids(generation_config) -> list[int]:
    eos = generation_config.eos_token_id
    return sorted(eos if isinstance(eos, list) else [eos])


def tokenizer_assets(processor) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        processor.tokenizer.save_pretrained(tmp)
        return {f"tokenizer/{p.name}": p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}


def onnx_component(name: str, model) -> Component:
    return Component(name, graph_io(model, "inputs"), graph_io(model, "outputs"), onnx=model)


def lowered(name: str, sizes: dict[str, Any], export_graph: Callable[[], onnx.ModelProto],
            modules: Sequence[torch.nn.Module]) -> Component:
    """One component exported, its `modules` in float32 on the export device for the duration only, under a
    progress line that names it with its depth; the next compile of the same sizes shows this one's time as its
    estimate."""
    depth = f" ({sizes['num_layers']} layers)" if "num_layers" in sizes else ""
    with stage(f"lowering {name}{depth} to ONNX", key=f"lower {name} {facts_digest(sizes)}"), \
            exported_as_float32(modules):
        graph = export_graph()
    gc.collect()
    return onnx_component(name, graph)


@contextlib.contextmanager
def exported_as_float32(modules: Sequence[torch.nn.Module]):
    """The modules' floating tensors as float32 on `export.trace_device()` while one component exports, their own
    tensors back afterwards: a bfloat16 checkpoint is widened one component at a time (exactly: every bfloat16 is
    a float32), and only the component being exported is ever held twice; under `source_weights.kept()` its large
    tensors are placeholders instead, and none is held twice."""
    target = export.trace_device()
    saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for module in modules:
        for t in itertools.chain(module.parameters(), module.buffers()):
            if id(t) in saved:
                continue
            wide = _stand_in(t)
            if wide is not t.data or t.device != target:
                saved[id(t)] = (t, t.data)
                t.data = wide.to(target)
    try:
        yield
    finally:
        for t, data in saved.values():
            t.data = data
        saved.clear()


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """What the export traces for `t`: a placeholder for a large weight that stays in the source model
    (`source_weights.kept()`), else its values as float32."""
    held = source_weights.placeholder(t.data)
    if held is not None:
        return held
    return t.data.float() if t.is_floating_point() else t.data


def language_components(model, llm: dict[str, Any]) -> dict[str, Component]:
    """The token embedding and the decoder (prefill and decode in one graph), exported."""
    table = {"vocab_size": llm["vocab_size"], "hidden_size": llm["hidden_size"]}
    lm = model.model.language_model
    return {
        "embed": lowered("embed", table, lambda: export.export_embedding(model), [lm.embed_tokens]),
        "llm": lowered("llm", llm, lambda: export.export_decoder(model, llm["num_layers"], llm["num_kv_heads"],
                                                                 llm["head_dim"], llm["hidden_size"]),
                       [lm, model.lm_head]),
    }
