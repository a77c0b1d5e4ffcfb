"""Regression rules: one night's result of a recipe against its baseline (the last good night), per metric."""

from __future__ import annotations

from typing import Any

from mmtrt.nightly.config import Rules

ACCURACY = ("digits.accuracy_pct", "parity.top1_agreement_pct", "parity.greedy_identical_pct")
PERPLEXITY = ("perplexity.perplexity",)


def _fired(rule: str, metric: str, base: float, now: float, change: float, limit: float, unit: str) -> dict:
    return {"rule": rule, "metric": metric, "baseline": base, "current": now, "change": round(change, 4),
            "threshold": limit, "message": f"{metric} {base:.6g} -> {now:.6g} ({change:+.4g} {unit}, limit {limit:g})"}


def _pct(base: float, now: float) -> float:
    return 100 * (now / base - 1) if base else 0.0


def _metric_rules(rules: Rules, metric: str) -> list[tuple[str, float | None, Any, str]]:
    """(rule, threshold, change(base, now), unit) for the rules that watch `metric`."""
    found = []
    if metric in ACCURACY:
        found.append(("accuracy_drop_points", rules.accuracy_drop_points, lambda b, n: b - n, "points"))
    if metric in PERPLEXITY:
        found.append(("perplexity_increase_pct", rules.perplexity_increase_pct, _pct, "%"))
    if metric.startswith("bench.") and metric.endswith("_ratio"):
        found.append(("latency_ratio_increase_pct", rules.latency_ratio_increase_pct, _pct, "%"))
    if metric == "build.bundle_mb":
        found.append(("bundle_size_increase_pct", rules.bundle_size_increase_pct, _pct, "%"))
    return found


def check(result: dict[str, Any], baseline: dict[str, Any] | None, rules: Rules) -> list[dict[str, Any]]:
    """The rules that fire for `result`; an empty list is a good night for the recipe."""
    if result["status"] != "ok":
        return [{"rule": "failed_build", "message": result["error"]}] if rules.failed_build else []
    fired = []
    if rules.nondeterminism and result.get("nondeterministic"):
        fired.append({"rule": "nondeterminism", "message": result["nondeterministic"]})
    if baseline is None:
        return fired
    now, base = result["metrics"], baseline["metrics"]
    for metric in sorted(set(now) & set(base)):
        for rule, limit, change, unit in _metric_rules(rules, metric):
            delta = round(change(base[metric], now[metric]), 9)  # 102/100 - 1 is not 0.02 in binary
            if limit is not None and delta > limit:
                fired.append(_fired(rule, metric, base[metric], now[metric], delta, limit, unit))
    compiled_both = result.get("cache") == "miss" and baseline.get("cache") == "miss"
    if rules.compile_time_increase_pct is not None and compiled_both and "build.compile_s" in base:
        delta = round(_pct(base["build.compile_s"], now["build.compile_s"]), 9)
        if delta > rules.compile_time_increase_pct:
            fired.append(_fired("compile_time_increase_pct", "build.compile_s", base["build.compile_s"],
                                now["build.compile_s"], delta, rules.compile_time_increase_pct, "%"))
    return fired
