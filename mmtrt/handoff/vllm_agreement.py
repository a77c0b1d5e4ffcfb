"""vLLM's top-1 agreement with a reference's greedy answers, as mmtrt's agreement suite (mmtrt/eval/agreement.py)
measures a bundle against its source: the reference's answer follows the prompt (teacher forcing), and at each
position that predicts one of its tokens vLLM agrees where that token is its most likely one. An accuracy budget's
`agreement_top1_drop` bounds 100 minus this percentage, so an exported folder served by vLLM (an INT4 one in
bfloat16, say) is held to the bundle's own budget with it; the benchmark states the split's accuracy with it."""

from __future__ import annotations

import numpy as np

from mmtrt.handoff.vllm_scheduler import collapse_image_runs
from mmtrt.runtime.batch import Request
from mmtrt.runtime.image_file import open_image


def answer_agreement(pipe, image, prompt: str, answer: list[int], own_vision: bool = False) -> tuple[int, int]:
    """(positions where vLLM's argmax is `answer`'s token, positions) for one image and prompt: the image through
    the bundle's vision side (the split, `pipe` a VllmPipeline), or with `own_vision` through vLLM's own
    preprocessing and vision tower."""
    if own_vision:
        ids, inputs = pipe.prompt_ids(prompt), {"image": np.asarray(open_image(image).convert("RGB"))}
    else:
        prep = pipe.prepare(0, Request(image, prompt, 1))
        ids, inputs = prep.ids, {"image_inputs": prep.embeds}
    ranks = pipe.engine.prompt_ranks(collapse_image_runs(ids, pipe.model["image_token_id"]) + list(answer), **inputs)
    return sum(r == 1 for r in ranks[-len(answer):]), len(answer)


def top1_agreement_pct(pairs: list[tuple[int, int]]) -> float:
    """The agreement suite's top1_agreement_pct over several answers' (agreeing, positions)."""
    return round(100 * sum(a for a, _ in pairs) / sum(n for _, n in pairs), 3)
