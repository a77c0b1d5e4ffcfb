"""Calibration data for weight quantization, run through the IR's own graphs in ONNX Runtime.

By default the LLM sees what it sees in use: digit images with the digits prompt, the image tokens' embeddings
replaced by the vision graph's features as the runtime does (a native-resolution model, Qwen2-VL, takes each digit
at its own size, its grid's indices and M-RoPE's three rows of positions), plus windows of English text. Text
windows are taken from the end of the reference text, so the perplexity suite (which reads from the start) never
sees them.
A recipe's own `calibration:` data (images with their prompts, text files) replaces either when a pass asks for
`recipe`; the compiler loads it at plan time and makes it current with `recipe_data` while the passes run.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from mmtrt.errors import UserError
from mmtrt.eval import userdata
from mmtrt.ir.facts import item_tokens
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.logits import LOGITS_FROM
from mmtrt.quant.calibration_images import encoded
from mmtrt.quant.session import session

TEXT_WINDOW = 512
BATCH_TOKENS = 512  # sequences of one length are batched up to about this many tokens


@dataclass
class Batches:
    """Feeds of the vision and LLM graphs, in the order calibration runs them (image and text batches alternate)."""

    vision: list[dict[str, np.ndarray]]
    llm: list[dict[str, np.ndarray]]


@dataclass
class Sequence:
    """One LLM input: embeddings [T, D], and M-RoPE's position rows [3, T] where an image's grid sets them (None:
    0..T-1 on every row)."""

    embeds: np.ndarray
    positions: np.ndarray | None = None


@dataclass(frozen=True)
class RecipeData:
    """The recipe's calibration data, read and checked at plan time."""

    samples: tuple[userdata.Sample, ...]
    text: str
    sha256: str

    def summary(self) -> dict:
        return {"images": len(self.samples), "text_chars": len(self.text), "sha256": self.sha256}


_current: ContextVar[RecipeData | None] = ContextVar("recipe_calibration_data", default=None)


def load_recipe_data(config, base: Path) -> RecipeData | None:
    """Read the recipe's `calibration:` section (folder, JSONL, text files); None when it declares nothing."""
    samples: list[userdata.Sample] = []
    if config.images:
        samples += userdata.image_folder(userdata.resolve(config.images, base), config.prompt)
    if config.jsonl:
        samples += userdata.jsonl(userdata.resolve(config.jsonl, base), answers=False, images="required")
    text = userdata.text_files([userdata.resolve(t, base) for t in config.text])
    if not samples and not text:
        return None
    return RecipeData(tuple(samples), text, userdata.digest(samples, text))


@contextmanager
def recipe_data(data: RecipeData | None) -> Iterator[None]:
    """Make `data` what `images: recipe` and `text: recipe` read while the passes run."""
    token = _current.set(data)
    try:
        yield
    finally:
        _current.reset(token)


def check_recipe_data(passes, data: RecipeData | None) -> None:
    """At plan time: every pass that asks for the recipe's data has it, and declared data is used by some pass."""
    used = False
    for i, p in enumerate(passes):
        cal = getattr(p.config, "calibration", None)
        for key, have, what in (("images", data and data.samples, "calibration.images or calibration.jsonl"),
                                ("text", data and data.text, "calibration.text")):
            if getattr(cal, key, None) != "recipe":
                continue
            used = True
            if not have:
                raise UserError(f"passes[{i}].{p.name}: calibration.{key}: recipe needs {what} at the top level of "
                                "the recipe; declare the data or use the built-in calibration")
    if data is not None and not used:
        raise UserError("the recipe declares calibration data but no pass uses it; set calibration: {images: recipe} "
                        "(or text: recipe) in awq_int4 or channel_prune, or remove the calibration section")


def calibration_batches(ir: ModelIR, images: str, samples: int, text_windows: int,
                        text: str = "reference") -> Batches:
    """`images`: `digits`, `recipe` or `none`; `text`: `reference` (Python's documentation) or `recipe`."""
    tokenizer = _tokenizer(ir)
    sequences, vision_feeds = [], []
    shown = _shown_images(images, samples, _page(ir))
    if shown:
        vision_inputs, image_sequences = _image_sequences(ir, tokenizer, shown)
        vision_feeds = _vision_batches(ir, vision_inputs)
        sequences.append(image_sequences)
    if text_windows:
        sequences.append([Sequence(e) for e in _text_sequences(ir, tokenizer, text_windows, text)])
    per_kind = [_batched_by_length(seqs) for seqs in sequences]
    ordered = [b for round_ in _interleave(per_kind) for b in round_]
    return Batches(vision_feeds, [_llm_feeds(ir, b) for b in ordered])


def image_embeds(ir: ModelIR, images: str, samples: int) -> list[np.ndarray]:
    """The LLM input embeddings [T, D] of each calibration image with its prompt, the IR's features in place."""
    shown = _shown_images(images, samples, _page(ir))
    return [seq.embeds for seq in _image_sequences(ir, _tokenizer(ir), shown)[1]] if shown else []


def _native_resolution(ir: ModelIR) -> bool:
    """Whether the model takes each image at its own size (Qwen2-VL: patches and grid indices per image)."""
    return ir.components["preprocess"].spec.get("family") == "qwen2_vl"


def _page(ir: ModelIR) -> int:
    """The side of the page a digit is drawn on: the vision input's side, or for a native-resolution model the
    digit's own size (it is seen as it is)."""
    if _native_resolution(ir):
        from mmtrt.eval.digits import SIDE

        return SIDE
    return ir.components["preprocess"].outputs[0].shape[-1]


def _vision_batches(ir: ModelIR, inputs: list) -> list[dict[str, np.ndarray]]:
    """Pixel arrays [3, H, W] stacked up to about BATCH_TOKENS image tokens a batch; a native-resolution model's
    feeds one image each (its graph attends over every patch it is given)."""
    if _native_resolution(ir):
        return inputs
    per_batch = max(1, BATCH_TOKENS // item_tokens(ir.config["vision"]))
    return [{"pixel_values": np.stack(b)} for b in _batched(inputs, per_batch)]


def _shown_images(images: str, samples: int, page: int) -> list[tuple[object, str]]:
    """(image, prompt) pairs: the first `samples` of the digits train split or of the recipe's data."""
    if images == "none" or not samples:
        return []
    if images == "recipe":
        data = _current.get()
        if data is None or not data.samples:
            raise UserError("calibration.images: recipe, but the recipe declares no calibration images")
        return [(s.image, s.prompt) for s in data.samples[:samples]]
    from mmtrt.eval import digits

    return [(img, digits.PROMPT) for img, _ in digits.samples("train", samples, page=page)]


def _tokenizer(ir: ModelIR):
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        for rel, content in ir.assets.items():
            if rel.startswith("tokenizer/"):
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / rel).write_bytes(content)
        return AutoTokenizer.from_pretrained(Path(tmp) / "tokenizer")


def _image_sequences(ir: ModelIR, tokenizer, shown) -> tuple[list, list[Sequence]]:
    """Each image with its prompt: its vision inputs (calibration_images.encoded), and the LLM's input with the
    image features in place."""
    from mmtrt.runtime.image_file import open_image
    from mmtrt.runtime.prompt import format_prompt, tokenize

    facts = ir.config
    images = [open_image(img).convert("RGB") for img, _ in shown]
    encodings = encoded(ir, images)
    embed = session(ir.components["embed"].onnx)
    vision_inputs, sequences = [], []
    for (_, prompt), (inputs, features, grid) in zip(shown, encodings):
        text = format_prompt(tokenizer, facts["chat_template"], prompt, raw=False)
        ids = np.array(tokenize(tokenizer, text, facts["image_token"], features.shape[0]), np.int64)
        e = embed.run(None, {"input_ids": ids[None]})[0][0]
        e[ids == facts["image_token_id"]] = features
        vision_inputs.extend(inputs)
        sequences.append(Sequence(e, None if grid is None else _mrope(ir, ids, grid)))
    return vision_inputs, sequences


def _mrope(ir: ModelIR, ids: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
    from mmtrt.runtime.qwen2_vl import mrope_positions

    return mrope_positions(ids.tolist(), ir.config["image_token_id"], [grid], ir.config["vision"]["merge_size"])[0]


def _text_sequences(ir: ModelIR, tokenizer, windows: int, source: str) -> list[np.ndarray]:
    """Windows of TEXT_WINDOW tokens: from the end of the reference text, or from the start of the recipe's text
    (as many whole windows as it holds, up to `windows`; all of it when it is shorter than one)."""
    if source == "recipe":
        data = _current.get()
        if data is None or not data.text:
            raise UserError("calibration.text: recipe, but the recipe declares no calibration.text files")
        ids = np.array(tokenizer(data.text, add_special_tokens=False)["input_ids"], np.int64)
        count = min(windows, len(ids) // TEXT_WINDOW)
        chosen = ids[:TEXT_WINDOW * count].reshape(count, TEXT_WINDOW) if count else ids[None]
    else:
        from mmtrt.eval.suites import reference_text

        ids = np.array(tokenizer(reference_text(), add_special_tokens=False)["input_ids"], np.int64)
        if len(ids) < TEXT_WINDOW * windows:
            raise ValueError(f"the reference text holds {len(ids)} tokens, fewer than {windows} windows of {TEXT_WINDOW}")
        chosen = ids[len(ids) - TEXT_WINDOW * windows:].reshape(windows, TEXT_WINDOW)
    embed = session(ir.components["embed"].onnx)
    return list(embed.run(None, {"input_ids": chosen})[0])


def _batched(items: list[np.ndarray], size: int) -> list[list[np.ndarray]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _batched_by_length(seqs: list[Sequence]) -> list[list[Sequence]]:
    """Sequences of one length together (prompts differ in length), up to about BATCH_TOKENS tokens a batch,
    in the order their lengths first appear."""
    by_length: dict[int, list[Sequence]] = {}
    for seq in seqs:
        by_length.setdefault(seq.embeds.shape[0], []).append(seq)
    return [b for length, group in by_length.items() for b in _batched(group, max(1, BATCH_TOKENS // length))]


def _interleave(lists: list[list]) -> list[list]:
    """Round-robin rounds: [[a0, b0], [a1, b1], [a2], ...], so any prefix mixes the kinds."""
    return [[lst[i] for lst in lists if i < len(lst)] for i in range(max(map(len, lists), default=0))]


def _llm_feeds(ir: ModelIR, seqs: list[Sequence]) -> dict[str, np.ndarray]:
    llm = ir.config["llm"]
    embeds = np.stack([s.embeds for s in seqs])
    batch, seq = embeds.shape[:2]
    positions = np.tile(np.arange(seq, dtype=np.int64), (batch, 1))
    if len(next(s for s in ir.components["llm"].inputs if s.name == "position_ids").shape) == 3:  # M-RoPE
        positions = np.stack([np.broadcast_to(positions[0], (3, seq)) if s.positions is None else s.positions
                              for s in seqs], axis=1)
    feeds = {"inputs_embeds": embeds.astype(np.float32), "attention_mask": np.ones((batch, seq), np.int64),
             "position_ids": positions}
    empty = np.zeros((batch, llm["num_kv_heads"], 0, llm["head_dim"]), np.float32)
    for spec in ir.components["llm"].inputs:
        if spec.name.startswith("past."):
            feeds[spec.name] = empty
        elif spec.name == LOGITS_FROM:  # every position's, as the lm_head's calibration reads them all
            feeds[spec.name] = np.zeros(1, np.int64)
    return feeds
