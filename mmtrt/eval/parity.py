"""The parity suite: a bundle against the PyTorch model it was compiled from, on held-out digits prompts.

A whole prompt's logits are [positions, vocabulary]: 0.9 GB of float32 for 1,500 positions of Qwen2's 152k
vocabulary, on each side. With the float32 PyTorch model and the bundle's sessions loaded together the suite needs
their sum: 12.6 GB at LLaVA-OneVision-0.5B's size, over 24 GB at Qwen2-VL-2B's. `parity_references` runs the
PyTorch side alone first, each prompt's logits kept in a file that is mapped back for the comparison, so that
`mmtrt eval` can drop the model before it loads the bundle: the two are never resident together.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmtrt.errors import UserError
from mmtrt.eval import digits
from mmtrt.eval.agreement import image_positions
from mmtrt.ir.resident import give_back_freed_memory
from mmtrt.progress import track
from mmtrt.runtime.pipeline import Pipeline

# prompt positions compared at a time: a prompt's whole logits in float64, with their log-softmax and the
# difference, took 11 GB at 3,000 positions of a 152k vocabulary
LOGIT_ROWS = 128


@dataclass
class Reference:
    image: Any
    ids: list[int]
    logits: np.ndarray  # [positions, vocabulary]: in memory, or mapped from the file it was saved to
    answer: list[int]


def parity_references(source, image_side: int, limit: int | None, folder: Path | None = None) -> list[Reference]:
    """The PyTorch model's prompt ids, logits and greedy answer on each held-out image; with `folder`, each
    prompt's logits are saved there and mapped back, so only one prompt's are in memory at a time."""
    model, processor = source
    data, out = digits.samples("heldout", limit, page=image_side), []
    for index, (image, _) in enumerate(track(data, "parity: the PyTorch model", total=len(data))):
        ids, logits, answer = _torch_reference(model, processor, image)
        if folder is not None:
            path = Path(folder) / f"logits{index}.npy"
            np.save(path, logits)
            del logits
            gc.collect()
            give_back_freed_memory()
            logits = np.load(path, mmap_mode="r")
        out.append(Reference(image, ids, logits, answer))
    return out


def parity_suite(pipe: Pipeline, limit: int | None = None, source=None, references: list[Reference] | None = None,
                 **_) -> dict[str, Any]:
    """Bundle against the PyTorch source on held-out digits: next-token agreement and KL over every prompt
    position, max abs logit difference, and whether the greedy answers are identical. `references` from
    `parity_references`, or computed here from `source` (model and processor), with both models loaded."""
    from mmtrt.eval.suites import result

    if references is None:
        references = parity_references(source, pipe.image_side, limit)
    agree = kl = positions = identical = 0
    max_abs = 0.0
    for ref in track(references, "parity images", total=len(references)):
        ids, features = pipe.encode_image(ref.image, pipe.prompt_ids(digits.PROMPT))
        if ids != ref.ids:
            raise UserError("the bundle tokenizes the prompt differently from the source model's processor")
        logits, _ = pipe.step(pipe.embed(np.array([ids], np.int64), features), pipe.empty_cache(),
                              image_positions(pipe, ref.image, ids))
        same, divergence, largest = logit_metrics(logits[0], ref.logits)
        agree, kl, max_abs = agree + same, kl + divergence, max(max_abs, largest)
        positions += len(ids)
        identical += pipe.generate(ref.image, digits.PROMPT, max_new_tokens=len(ref.answer)).token_ids == ref.answer
    metrics = {"top1_agreement_pct": round(100 * agree / positions, 3), "mean_kl": kl / positions,
               "max_abs_logit_diff": max_abs, "greedy_identical_pct": round(100 * identical / len(references), 2)}
    return result("parity", pipe, metrics, {"images": len(references), "positions": positions})


def logit_metrics(ours: np.ndarray, ref: np.ndarray) -> tuple[int, float, float]:
    """Over the positions of two [positions, vocab] logits: how many share their argmax, the summed KL(ref || ours)
    and the largest absolute difference, LOGIT_ROWS positions at a time."""
    import torch

    agree, kl, max_abs = 0, 0.0, 0.0
    for start in range(0, len(ours), LOGIT_ROWS):
        a = torch.from_numpy(np.array(ours[start:start + LOGIT_ROWS])).double()
        b = torch.from_numpy(np.array(ref[start:start + LOGIT_ROWS])).double()
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        kl += float(torch.nn.functional.kl_div(a.log_softmax(-1), b.log_softmax(-1), log_target=True,
                                               reduction="sum"))
        max_abs = max(max_abs, float((a - b).abs().max()))
    return agree, kl, max_abs


def _torch_reference(model, processor, image):
    import torch

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": digits.PROMPT}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    # A template that writes the BOS token itself (Mistral's, Gemma's) must not get a second one from the
    # tokenizer: transformers' own `apply_chat_template(tokenize=True)` makes the same test.
    bos = processor.tokenizer.bos_token
    inputs = processor(images=image, text=text, return_tensors="pt",
                       add_special_tokens=not (bos and text.startswith(bos)))
    with torch.no_grad():
        logits = model(**inputs).logits[0].numpy()
        out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    return inputs["input_ids"][0].tolist(), logits, out[0, inputs["input_ids"].shape[1]:].tolist()
