"""Calibration data for weight quantization, run through the IR's own graphs in ONNX Runtime.

By default the LLM sees what it sees in use: digit images with the digits prompt, the image tokens' embeddings
replaced by the vision graph's features as the runtime does, plus windows of English text. Text windows are taken
from the end of the reference text, so the perplexity suite (which reads from the start) never sees them.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from mmtrt.backends.onnxruntime_backend import session_options
from mmtrt.ir.graph import ModelIR

TEXT_WINDOW = 512
BATCH_TOKENS = 512  # sequences of one length are batched up to about this many tokens


@dataclass
class Batches:
    """Feeds of the vision and LLM graphs, in the order calibration runs them (image and text batches alternate)."""

    vision: list[dict[str, np.ndarray]]
    llm: list[dict[str, np.ndarray]]


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), session_options(None, spin=False),
                                providers=["CPUExecutionProvider"])


def run_with_outputs(model: onnx.ModelProto, names: list[str],
                     batches: list[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """Run `model` on each batch for the tensors `names` alone; yields them with the feeds."""
    graph_inputs = {v.name for v in model.graph.input}
    extra = [n for n in dict.fromkeys(names) if n not in graph_inputs]
    declared = [onnx.ValueInfoProto.FromString(o.SerializeToString()) for o in model.graph.output]
    del model.graph.output[:]  # only the captures: ONNX Runtime then drops the nodes they do not need (lm_head)
    model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in extra)
    try:
        sess = session(model)
    finally:
        del model.graph.output[:]
        model.graph.output.extend(declared)
    for feeds in batches:
        yield {**feeds, **dict(zip(extra, sess.run(extra, feeds)))}


def calibration_batches(ir: ModelIR, images: str, samples: int, text_windows: int) -> Batches:
    tokenizer = _tokenizer(ir)
    sequences, vision_feeds = [], []
    if images == "digits" and samples:
        pixels, embeds = _image_sequences(ir, tokenizer, samples)
        per_batch = max(1, BATCH_TOKENS // ir.config["vision"]["image_tokens"])
        vision_feeds = [{"pixel_values": np.stack(b)} for b in _batched(pixels, per_batch)]
        sequences.append(embeds)
    if text_windows:
        sequences.append(_text_sequences(ir, tokenizer, text_windows))
    per_kind = [_batched(seqs, max(1, BATCH_TOKENS // seqs[0].shape[0])) for seqs in sequences]
    ordered = [b for round_ in _interleave(per_kind) for b in round_]
    return Batches(vision_feeds, [_llm_feeds(ir, np.stack(b)) for b in ordered])


def _tokenizer(ir: ModelIR):
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        for rel, content in ir.assets.items():
            if rel.startswith("tokenizer/"):
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / rel).write_bytes(content)
        return AutoTokenizer.from_pretrained(Path(tmp) / "tokenizer")


def _image_sequences(ir: ModelIR, tokenizer, samples: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Digits train images with the digits prompt: pixel values, and LLM input embeddings with image features."""
    from mmtrt.backends.torchvision_backend import build_transform
    from mmtrt.eval import digits
    from mmtrt.runtime.prompt import format_prompt, tokenize

    transform = build_transform(ir.components["preprocess"].spec)
    facts = ir.config
    text = format_prompt(tokenizer, facts["chat_template"], digits.PROMPT, raw=False)
    ids = np.array(tokenize(tokenizer, text, facts["image_token"], facts["vision"]["image_tokens"]), np.int64)
    vision, embed = session(ir.components["vision"].onnx), session(ir.components["embed"].onnx)
    prompt = embed.run(None, {"input_ids": ids[None]})[0][0]
    image_rows = ids == facts["image_token_id"]
    pixels, embeds = [], []
    for img, _ in digits.samples("train", samples, page=ir.components["preprocess"].outputs[0].shape[-1]):
        p = transform(img)[None].numpy()
        features = vision.run(None, {"pixel_values": p})[0]
        e = prompt.copy()
        e[image_rows] = features.reshape(-1, features.shape[-1])
        pixels.append(p[0])
        embeds.append(e)
    return pixels, embeds


def _text_sequences(ir: ModelIR, tokenizer, windows: int) -> list[np.ndarray]:
    from mmtrt.eval.suites import reference_text

    ids = np.array(tokenizer(reference_text(), add_special_tokens=False)["input_ids"], np.int64)
    if len(ids) < TEXT_WINDOW * windows:
        raise ValueError(f"the reference text holds {len(ids)} tokens, fewer than {windows} windows of {TEXT_WINDOW}")
    tail = ids[len(ids) - TEXT_WINDOW * windows:].reshape(windows, TEXT_WINDOW)
    embed = session(ir.components["embed"].onnx)
    return list(embed.run(None, {"input_ids": tail})[0])


def _batched(items: list[np.ndarray], size: int) -> list[list[np.ndarray]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _interleave(lists: list[list]) -> list[list]:
    """Round-robin rounds: [[a0, b0], [a1, b1], [a2], ...], so any prefix mixes the kinds."""
    return [[lst[i] for lst in lists if i < len(lst)] for i in range(max(map(len, lists), default=0))]


def _llm_feeds(ir: ModelIR, embeds: np.ndarray) -> dict[str, np.ndarray]:
    llm = ir.config["llm"]
    batch, seq = embeds.shape[:2]
    feeds = {"inputs_embeds": embeds.astype(np.float32), "attention_mask": np.ones((batch, seq), np.int64),
             "position_ids": np.tile(np.arange(seq, dtype=np.int64), (batch, 1))}
    empty = np.zeros((batch, llm["num_kv_heads"], 0, llm["head_dim"]), np.float32)
    for spec in ir.components["llm"].inputs:
        if spec.name.startswith("past."):
            feeds[spec.name] = empty
    return feeds
