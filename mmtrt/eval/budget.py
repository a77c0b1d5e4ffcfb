"""Accuracy budgets: measure the unmodified model, then the cost of every lossy pass, and stop the compile
when the lossy passes together spend more than the recipe allows.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

from mmtrt.errors import UserError
from mmtrt.eval.suites import run_suite
from mmtrt.ir.graph import ModelIR
from mmtrt.pipeline.instruments import Instrument
from mmtrt.progress import stage as progress_stage
from mmtrt.recipe import Budgets

# (suite, metric, budget it is spent from, how a change in it is expressed as a cost: positive = worse)
COSTS = [
    ("digits", "accuracy_pct", "digits_accuracy_drop", lambda base, now: round(base - now, 2)),
    ("perplexity", "perplexity", "perplexity_increase_pct", lambda base, now: round(100 * (now / base - 1), 3)),
    ("qa", "accuracy_pct", "qa_accuracy_drop", lambda base, now: round(base - now, 2)),
    ("agreement", "top1_agreement_pct", "agreement_top1_drop", lambda base, now: round(base - now, 3)),
    ("agreement", "mean_kl", "agreement_kl_increase", lambda base, now: float(f"{now - base:.4g}")),
]


class Evaluate(Instrument):
    """After every lossy pass, stage the IR as a bundle in a temporary folder and run the suites on it."""

    def __init__(self, suites: list[str], options: dict[str, dict], stage: Callable[[ModelIR, Path], Any]):
        self.suites, self.stage, self.options = suites, stage, options
        self.baseline: dict[str, dict] = {}
        self.previous: dict[str, dict] = {}
        self.per_pass: list[dict] = []
        self.passes_seen = 0  # the recipe index of the pass `after` sees, for reports that name it

    def measure(self, ir: ModelIR) -> dict[str, dict]:
        from mmtrt.runtime import load

        with tempfile.TemporaryDirectory(prefix="mmtrt-eval-") as tmp:
            self.stage(ir, Path(tmp))
            pipe = load(tmp)
            return {s: run_suite(pipe, s, **self.options[s]) for s in self.suites}

    def measure_baseline(self, ir: ModelIR) -> None:
        with progress_stage(f"measuring the unmodified model ({', '.join(self.suites)})"):
            self.baseline = self.previous = self.measure(ir)

    def after(self, p, ir, report):
        self.passes_seen += 1
        if not p.lossy:
            return
        with progress_stage(f"measuring after {p.name} ({', '.join(self.suites)})"):
            now = self.measure(ir)
        cost = costs(self.previous, now)
        report["accuracy"] = {"metrics": metrics(now), "cost": cost}
        self.per_pass.append({"index": self.passes_seen - 1, "pass": p.name, "cost": cost})
        self.previous = now

    def summary(self) -> dict[str, Any]:
        return {
            "suites": {s: {"samples": r["samples"]} for s, r in self.baseline.items()},
            "baseline": metrics(self.baseline),
            "final": metrics(self.previous),
            "total_cost": costs(self.baseline, self.previous),
            "lossy_passes": self.per_pass,
        }


def metrics(results: dict[str, dict]) -> dict[str, float]:
    return {f"{suite}.{metric}": results[suite]["metrics"][metric] for suite, metric, _, _ in COSTS
            if suite in results}


def costs(before: dict[str, dict], after: dict[str, dict]) -> dict[str, float]:
    return {name: cost(before[suite]["metrics"][metric], after[suite]["metrics"][metric])
            for suite, metric, name, cost in COSTS if suite in before}


def check_budgets(budgets: Budgets, evaluation: dict[str, Any]) -> None:
    """Raise a one-line report naming each lossy pass and what it spent when a budget is exceeded."""
    over = [f"{name} {evaluation['total_cost'][name]} > budget {limit}"
            for name, limit in budgets.model_dump().items()
            if limit is not None and evaluation["total_cost"].get(name, 0) > limit]
    if not over:
        return
    spent = "; ".join(f"passes[{p['index']}] {p['pass']} cost " + ", ".join(f"{k} {v}" for k, v in p["cost"].items())
                      for p in evaluation["lossy_passes"]) or "no lossy pass ran"
    raise UserError(f"accuracy budget exceeded: {', '.join(over)} ({spent}); loosen the budget or make the lossy "
                    "passes gentler; no bundle was written")
