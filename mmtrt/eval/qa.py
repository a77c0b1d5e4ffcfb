"""The qa suite: the user's own questions about their images, each answer scored against a label."""

from __future__ import annotations

from typing import Any

from mmtrt.eval.scorers import scorer as get_scorer
from mmtrt.eval.userdata import Sample
from mmtrt.progress import track
from mmtrt.runtime.image_file import open_image
from mmtrt.runtime.pipeline import Pipeline


def qa_suite(pipe: Pipeline, limit: int | None = None, data: list[Sample] | None = None, scorer: str = "contains",
             tolerance: float = 0.0, max_new_tokens: int = 16, **_) -> dict[str, Any]:
    """Accuracy of the greedy answers on `data` ({image, prompt, answer} samples) under `scorer`."""
    samples = data[:limit]
    score = get_scorer(scorer)
    correct = 0
    for s in track(samples, "qa questions", total=len(samples)):
        answer = pipe.generate(open_image(s.image).convert("RGB"), s.prompt, max_new_tokens=max_new_tokens).text
        correct += score(answer, s.answer, tolerance)
    return {"suite": "qa", "metrics": {"accuracy_pct": round(100 * correct / len(samples), 2)},
            "samples": {"questions": len(samples)}, "scorer": scorer, "bundle_sha256": pipe.hash}
