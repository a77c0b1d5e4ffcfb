"""The LLM through TensorRT-LLM, where the bundle has an engine for this host; vision and embedding stay on theirs.

TensorRT-LLM takes image features as a prompt table (prompt tuning): the image tokens of a prompt become virtual
token ids vocab_size + i, and the engine embeds id v as row v - vocab_size of the request's table instead of the
vocabulary's row (examples/multimodal, LLaVA; `--max_multimodal_len` sizes the table). `prompt_table` does that
mapping. The engine runs in the TensorRT-LLM worker (mmtrt/handoff/trtllm_worker.py), a process in TensorRT-LLM's
own environment that drives `tensorrt_llm.runtime.ModelRunnerCpp` (from_dir, then generate with prompt_table /
prompt_tasks, one task per request); requests go to it in chunks of at most the engine's max_batch_size, which a
larger generate() call would exceed.

An M-RoPE engine (Qwen2-VL's, position_embedding_type mrope) also takes per request what TensorRT-LLM's multimodal
runner computes in `setup_fake_prompts_qwen2vl` (tensorrt_llm/runtime/multimodal_model_runner.py) and hands
ModelRunnerCpp.generate as `mrope_params=MropeParams(...)` (tensorrt_llm/layers/attention.py): the prompt's rotary
cos/sin (`mrope_cos_sin`, from the three rows of position ids the Qwen2-VL runtime computes) and its rope delta, which
the engine adds to the sequence length at each decode step.

NOT RUN: TensorRT-LLM cannot be installed where this was written. Tested here: the prompt table, the chunking, the
M-RoPE cos/sin against transformers' rotary embedding, and what goes to the worker.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmtrt.handoff.trtllm_process import TrtllmProcess
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


def mrope_cos_sin(positions: np.ndarray, mrope: dict[str, Any]) -> np.ndarray:
    """One request's mrope_rotary_cos_sin, float32 [max_position_embeddings * head_size]: for the prompt's token t and
    frequency j the pair (cos, sin) of position_ids[row(j), t] * inv_freq[j], row(j) the M-RoPE section j falls in
    (temporal, height, width), tokens past the prompt at position 0 (the runner zero-pads the ids).

    The table is RopeEmbeddingUtils.create_sinusoidal_positions_for_attention_plugin's with RotaryScalingType.mrope
    (tensorrt_llm/functional.py: inv_freq = 1 / theta^(2j/d) and the angles in float32, cos and sin interleaved as
    float2); the runner takes its rows at the position ids and the sections of each row (TensorRT-LLM's runner
    hard-codes Qwen2-VL's [16, 24, 24] for head size 128; here they are the checkpoint's). `mrope`: the engine's
    head_size, rotary_base, max_position_embeddings and mrope_section; positions: [3, prompt length]."""
    d, most = mrope["head_size"], mrope["max_position_embeddings"]
    inv_freq = 1.0 / (float(mrope["rotary_base"]) ** (np.arange(0, d, 2) / d)).astype(np.float32)
    if positions.shape[1] > most:
        raise ValueError(f"a prompt of {positions.shape[1]} tokens exceeds max_position_embeddings {most}")
    padded = np.zeros((3, most), np.float32)
    padded[:, : positions.shape[1]] = positions
    rows = np.repeat(np.arange(3), mrope["mrope_section"])  # [d / 2]: the row of each frequency
    picked = padded[rows].T * inv_freq[None, :]  # [most, d / 2]: the table's row at each position, in float32
    return np.stack([np.cos(picked), np.sin(picked)], axis=-1).reshape(-1).astype(np.float32)


def request_mrope(prep: Prepared, mrope: dict[str, Any]) -> tuple[np.ndarray, int]:
    """The request's cos/sin and rope delta; a prompt without M-RoPE rows counts up on all three."""
    positions = prep.positions[:, 0, :] if prep.positions is not None else np.broadcast_to(np.arange(len(prep.ids)),
                                                                                             (3, len(prep.ids)))
    return mrope_cos_sin(positions, mrope), prep.rope_delta


class TrtllmLLM:
    """Greedy generation of prepared requests on a TensorRT-LLM engine, as `Sequence`s like the ONNX paths'."""

    providers = ["TensorRT-LLM"]

    def __init__(self, engine_dir, plan: dict[str, Any], model: dict[str, Any], worker=None):
        self.worker = worker or TrtllmProcess()
        loaded, _ = self.worker.call("load", engine_dir=str(engine_dir),
                                     max_tokens_in_paged_kv_cache=plan["runtime"]["max_tokens_in_paged_kv_cache"])
        self.vocab_size, self.max_batch = loaded["vocab_size"], loaded["max_batch_size"]
        self.mrope = loaded.get("mrope")  # the engine's M-RoPE settings, None for plain RoPE
        self.image_token_id = model["image_token_id"]
        self.eos = list(model["eos_token_ids"])

    def decode(self, prepared: list[Prepared]) -> dict[int, Sequence]:
        """The requests in chunks of at most the engine's max_batch_size (in-flight batching inside each call), each
        request with its own prompt table."""
        done = {}
        for start in range(0, len(prepared), self.max_batch):
            done.update(self._generate(prepared[start:start + self.max_batch]))
        return done

    def _generate(self, prepared: list[Prepared]) -> dict[int, Sequence]:
        ids, tables = zip(*(prompt_table(p.ids, p.embeds[0][np.asarray(p.ids) == self.image_token_id],
                                         self.image_token_id, self.vocab_size) for p in prepared))
        table = np.zeros((len(tables), max(len(t) for t in tables), tables[0].shape[-1]), np.float32)
        for i, t in enumerate(tables):
            table[i, : len(t)] = t
        arrays = {f"ids_{i}": np.asarray(v, np.int32) for i, v in enumerate(ids)} | {"table": table}
        if self.mrope is not None:
            cos_sin, deltas = zip(*(request_mrope(p, self.mrope) for p in prepared))
            arrays |= {"mrope_cos_sin": np.stack(cos_sin), "mrope_deltas": np.asarray(deltas, np.int32)[:, None]}
        out, tokens = self.worker.call("generate", arrays, requests=len(prepared), end_id=self.eos[0],
                                       pad_id=self.eos[0], max_new_tokens=max(p.limit for p in prepared))
        done = {}
        for i, prep in enumerate(prepared):
            seq = Sequence(prep, _until_eos(tokens[f"tokens_{i}"].tolist(), self.eos, prep.limit))
            seq.decode_s = out["seconds"]
            prep.timings["llm_ms"] = 1e3 * out["seconds"]
            done[prep.index] = seq
        return done

    def close(self) -> None:
        self.worker.close()


def _until_eos(tokens: list[int], eos: list[int], limit: int) -> list[int]:
    """The greedy tokens up to and with the first EOS (any of the model's), at most `limit`, as the ONNX paths stop."""
    for n, token in enumerate(tokens[:limit]):
        if token in eos:
            return tokens[: n + 1]
    return tokens[:limit]
