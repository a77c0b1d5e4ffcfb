"""Evaluation suites. Each runs the bundle itself (ONNX Runtime here), never the PyTorch model it came from,
except `parity` and `agreement`, which compare the two on the same inputs. `qa` and `agreement` run on the user's
own data (mmtrt/eval/qa.py, mmtrt/eval/agreement.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from mmtrt.errors import UserError
from mmtrt.eval import digits
from mmtrt.eval.agreement import agreement_suite
from mmtrt.eval.parity import parity_suite
from mmtrt.eval.qa import qa_suite
from mmtrt.progress import track
from mmtrt.runtime.pipeline import Pipeline

SUITES = ("digits", "perplexity", "parity", "qa", "agreement")
PERPLEXITY_WINDOW = 512
DEFAULT_LIMITS = {"digits": None, "perplexity": 8, "parity": 8, "qa": None, "agreement": None}


def result(suite: str, pipe: Pipeline, metrics: dict[str, float], samples: dict[str, int]) -> dict[str, Any]:
    return {"suite": suite, "metrics": metrics, "samples": samples, "bundle_sha256": pipe.hash}


def digits_suite(pipe: Pipeline, limit: int | None = None, **_) -> dict[str, Any]:
    """Answer accuracy on the held-out digits: the first digit in the greedy answer must be the label."""
    data = digits.samples("heldout", limit, page=pipe.image_side)
    answers = [pipe.generate(img, digits.PROMPT, max_new_tokens=4) for img, _ in track(data, "digits images",
                                                                                         total=len(data))]
    correct = sum(digits.parse_answer(a.text) == label for a, (_, label) in zip(answers, data))
    metrics = {"accuracy_pct": round(100 * correct / len(data), 2)}
    if pipe.dynamic_tokens:
        metrics.update(kept_tokens(a.image_tokens for a in answers))
    return result("digits", pipe, metrics, {"images": len(data)})


def kept_tokens(counts) -> dict[str, float]:
    """The spread of image tokens kept per image under token_prune's dynamic budget."""
    counts = np.fromiter(counts, np.int64)
    return {"kept_tokens_mean": round(float(counts.mean()), 2), "kept_tokens_min": int(counts.min()),
            "kept_tokens_max": int(counts.max())}


def reference_text() -> str:
    """Python's own documentation (pydoc_data.topics), in key order: fixed English text available offline."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def window_nll(pipe: Pipeline, ids: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of tokens 1..n-1 of one window, predicted by the bundle's LLM."""
    logits, _ = pipe.step(pipe.embed(ids[None]), pipe.empty_cache())
    logits = logits[0, :-1].astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return logz - logits[np.arange(len(ids) - 1), ids[1:]]


def perplexity_suite(pipe: Pipeline, limit: int | None = None, text_file: Path | None = None, **_) -> dict[str, Any]:
    """Perplexity over fixed, non-overlapping windows of the text (no chat template, no image)."""
    text = reference_text() if text_file is None else _read_text(text_file)
    window = min(PERPLEXITY_WINDOW, pipe.dims["seq"]["max"])
    ids = np.array(pipe.tokenizer(text, add_special_tokens=False)["input_ids"], np.int64)
    count = len(ids) // window if limit is None else min(limit, len(ids) // window)
    if count == 0:
        raise UserError(f"the text has {len(ids)} tokens, fewer than one window of {window}; give a longer --text")
    nll = np.concatenate([window_nll(pipe, ids[i * window:(i + 1) * window])
                          for i in track(range(count), "perplexity windows", total=count)])
    return result("perplexity", pipe, {"perplexity": round(float(np.exp(nll.mean())), 4)},
                  {"tokens": int(nll.size), "windows": count, "window": window})


def _read_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read --text {path} ({exc}); pass a UTF-8 text file") from None


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    "digits": digits_suite, "perplexity": perplexity_suite, "parity": parity_suite, "qa": qa_suite,
    "agreement": agreement_suite}


def run_suite(pipe: Pipeline, suite: str, limit: int | None = None, **kwargs) -> dict[str, Any]:
    if suite not in RUNNERS:
        raise UserError(f"unknown suite {suite!r}; available: {', '.join(SUITES)}")
    return RUNNERS[suite](pipe, suite_limit(suite, limit), **kwargs)


def suite_limit(suite: str, limit: int | None) -> int | None:
    """`limit` checked, or the suite's default where it is None."""
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise UserError(f"limit {limit!r} is not a positive integer; pass --limit 1 or more, or leave it out")
    return DEFAULT_LIMITS[suite] if limit is None else limit
