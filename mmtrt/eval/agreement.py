"""The agreement suite: how closely the bundle follows the model it was compiled from, on the user's prompts.

No labels: the source model (PyTorch) answers every prompt greedily, and at each position that predicts a token of
its answer the bundle, fed the same answer (teacher forcing), is compared with it: top-1 agreement (the bundle's
most likely token is the source's) and KL(source || bundle) of the next-token distributions. Each side tokenizes
the prompt its own way, so passes that change the image-token count (token_prune) are compared fairly. Prompts
may be text only; the source's references are computed once per run and reused for every measurement.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmtrt.errors import UserError
from mmtrt.eval.userdata import Sample
from mmtrt.progress import track
from mmtrt.runtime.image_file import open_image
from mmtrt.runtime.pipeline import Pipeline


def agreement_suite(pipe: Pipeline, limit: int | None = None, data: list[Sample] | None = None, source=None,
                    max_new_tokens: int = 16, references: dict | None = None, **_) -> dict[str, Any]:
    samples = data[:limit]
    references = {} if references is None else references
    agree = positions = 0
    kl = 0.0
    for s in track(samples, "agreement prompts", total=len(samples)):
        key = (s.where, max_new_tokens)
        if key not in references:
            references[key] = source_reference(source, s, max_new_tokens)
        answer, ref_logp = references[key]
        ours = log_softmax(bundle_logits(pipe, s, answer))
        agree += int((ours.argmax(-1) == ref_logp.argmax(-1)).sum())
        kl += float((np.exp(ref_logp) * (ref_logp - ours)).sum())
        positions += len(answer)
    metrics = {"top1_agreement_pct": round(100 * agree / positions, 3), "mean_kl": kl / positions}
    return {"suite": "agreement", "metrics": metrics, "samples": {"prompts": len(samples), "positions": positions},
            "bundle_sha256": pipe.hash}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def source_reference(source, sample: Sample, max_new_tokens: int) -> tuple[list[int], np.ndarray]:
    """The source's greedy answer and its log-probabilities at the positions that predict each answer token."""
    import torch

    model, processor = source
    content = ([{"type": "image"}] if sample.image else []) + [{"type": "text", "text": sample.prompt}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    image = open_image(sample.image).convert("RGB") if sample.image else None
    inputs = processor(images=image, text=text, return_tensors="pt") if image else processor(text=text, return_tensors="pt")
    prompt_len = inputs["input_ids"].shape[1]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        answer = out[0, prompt_len:].tolist()
        full = {**inputs, "input_ids": out[:, :-1], "attention_mask": torch.ones_like(out[:, :-1])}
        if "mm_token_type_ids" in inputs:  # Qwen2-VL's processor marks the image's tokens; the answer's are text (0)
            full["mm_token_type_ids"] = torch.nn.functional.pad(inputs["mm_token_type_ids"],
                                                                (0, out.shape[1] - 1 - prompt_len))
        logits = model(**full).logits[0, prompt_len - 1:].double()
    return answer, logits.log_softmax(-1).numpy()


def bundle_logits(pipe: Pipeline, sample: Sample, answer: list[int]) -> np.ndarray:
    """The bundle's logits at the positions that predict each token of `answer`, fed the prompt and the answer."""
    ids = pipe.prompt_ids(sample.prompt) if sample.image else text_prompt_ids(pipe, sample.prompt)
    features = None
    if sample.image:
        ids, features = pipe.encode_image(open_image(sample.image).convert("RGB"), ids)
    if len(ids) + len(answer) - 1 > pipe.dims["seq"]["max"]:
        raise UserError(f"{sample.where}: the prompt and the source's {len(answer)}-token answer are "
                        f"{len(ids) + len(answer) - 1} tokens, more than the bundle's {pipe.dims['seq']['max']}; "
                        "shorten the prompt or lower evaluate.agreement.max_new_tokens")
    sequence = ids + answer[:-1]
    positions = image_positions(pipe, sample.image, sequence) if sample.image else None
    logits, _ = pipe.step(pipe.embed(np.array([sequence], np.int64), features), pipe.empty_cache(), positions)
    return logits[0, len(ids) - 1:]


def image_positions(pipe: Pipeline, image, ids: list[int]) -> np.ndarray | None:
    """The positions of `ids` where the family sets them from the image (Qwen2-VL's three M-RoPE rows), else None:
    the bundle counts them on from 0."""
    return pipe.family.positions(ids, [pipe.pixel_values(open_image(image).convert("RGB"))])[0] if pipe.family else None


def text_prompt_ids(pipe: Pipeline, prompt: str) -> list[int]:
    """A prompt without an image, through the bundle's chat template, tokenized as the processor does."""
    tok = pipe.tokenizer
    messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
    text = tok.apply_chat_template(messages, chat_template=pipe.model["chat_template"], add_generation_prompt=True,
                                   tokenize=False)
    return tok(text, add_special_tokens=not (tok.bos_token and text.startswith(tok.bos_token)))["input_ids"]
