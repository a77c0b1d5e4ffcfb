"""The LLM through TensorRT-LLM, where the bundle has an engine for this host; vision and embedding stay on theirs.

TensorRT-LLM takes image features as a prompt table (prompt tuning): the image tokens of a prompt become virtual
token ids vocab_size + i, and the engine embeds id v as row v - vocab_size of the request's table instead of the
vocabulary's row (examples/multimodal, LLaVA; `--max_multimodal_len` sizes the table). `prompt_table` does that
mapping; everything else here drives `tensorrt_llm.runtime.ModelRunnerCpp` (from_dir, then generate with
prompt_table / prompt_tasks, one task per request), imported only when an engine was selected.

NOT RUN: TensorRT-LLM cannot be installed where this was written; the calls follow ModelRunnerCpp as
tensorrt_llm/runtime/model_runner_cpp.py (NVIDIA/TensorRT-LLM) defines it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from mmtrt.runtime.batch import Prepared, Sequence


def prompt_table(ids: list[int] | np.ndarray, features: np.ndarray, image_token_id: int,
                 vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The prompt's ids with its image tokens replaced by virtual ids vocab_size, vocab_size + 1, ... in order,
    and the table whose row i is the feature row of the i-th image token."""
    ids = np.asarray(ids, np.int64)
    image = ids == image_token_id
    features = np.asarray(features).reshape(-1, np.asarray(features).shape[-1])
    if int(image.sum()) != len(features):
        raise ValueError(f"the prompt holds {int(image.sum())} image tokens for {len(features)} feature rows")
    virtual = ids.copy()
    virtual[image] = vocab_size + np.arange(len(features))
    return virtual, features


class TrtllmLLM:
    """Greedy generation of prepared requests on a TensorRT-LLM engine, as `Sequence`s like the ONNX paths'."""

    providers = ["TensorRT-LLM"]

    def __init__(self, engine_dir, plan: dict[str, Any], model: dict[str, Any]):
        from tensorrt_llm.runtime import ModelRunnerCpp

        self.runner = ModelRunnerCpp.from_dir(
            str(engine_dir), max_tokens_in_paged_kv_cache=plan["runtime"]["max_tokens_in_paged_kv_cache"])
        # the engine's config.json, as trtllm-build writes it: {"version", "pretrained_config", "build_config"}
        self.vocab_size = json.loads((Path(engine_dir) / "config.json").read_text())["pretrained_config"]["vocab_size"]
        self.image_token_id = model["image_token_id"]
        self.eos = list(model["eos_token_ids"])

    def decode(self, prepared: list[Prepared]) -> dict[int, Sequence]:
        """All requests in one generate call (in-flight batching inside the executor), each with its own table."""
        import torch

        if not prepared:
            return {}
        ids, tables = zip(*(prompt_table(p.ids, p.embeds[0][np.asarray(p.ids) == self.image_token_id],
                                         self.image_token_id, self.vocab_size) for p in prepared))
        rows = max(len(t) for t in tables)
        table = np.zeros((len(tables), rows, tables[0].shape[-1]), np.float32)
        for i, t in enumerate(tables):
            table[i, : len(t)] = t
        started = time.perf_counter()
        out = self.runner.generate(
            [torch.tensor(i, dtype=torch.int32) for i in ids], max_new_tokens=max(p.limit for p in prepared),
            end_id=self.eos[0], pad_id=self.eos[0], stop_words_list=None, prompt_table=torch.from_numpy(table),
            prompt_tasks=",".join(str(i) for i in range(len(prepared))), return_dict=True,
            output_sequence_lengths=True)
        seconds = time.perf_counter() - started
        done = {}
        for i, prep in enumerate(prepared):
            end = int(out["sequence_lengths"][i][0])
            seq = Sequence(prep, _until_eos(out["output_ids"][i][0][len(prep.ids): end].tolist(), self.eos, prep.limit))
            seq.decode_s = seconds
            prep.timings["llm_ms"] = 1e3 * seconds
            done[prep.index] = seq
        return done


def _until_eos(tokens: list[int], eos: list[int], limit: int) -> list[int]:
    """The greedy tokens up to and with the first EOS (any of the model's), at most `limit`, as the ONNX paths stop."""
    for n, token in enumerate(tokens[:limit]):
        if token in eos:
            return tokens[: n + 1]
    return tokens[:limit]
