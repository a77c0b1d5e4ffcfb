"""The report's pictures (matplotlib, PNG): every metric over the nights, one line per recipe, and the current
night against each recipe's baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIRED_COLOR, OK_COLOR = "#c0392b", "#2e86c1"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def safe_name(metric: str) -> str:
    return metric.replace(".", "-").replace("/", "-")


def metric_over_nights(series: list[dict[str, Any]], metric: str, path: Path) -> Path:
    """x: the nights in order (labels), y: the metric; one line per recipe, a hollow marker where a rule fired."""
    plt = _pyplot()
    labels = list(dict.fromkeys(r["label"] for r in series))
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=90)
    for recipe in sorted({r["recipe"] for r in series}):
        points = [(labels.index(r["label"]), r["metrics"][metric], bool(r["fired"])) for r in series
                  if r["recipe"] == recipe and metric in r["metrics"]]
        if not points:
            continue
        xs, ys, fired = zip(*points)
        line = ax.plot(xs, ys, marker="o", label=recipe)[0]
        bad = [(x, y) for x, y, f in points if f]
        if bad:
            ax.scatter(*zip(*bad), s=120, facecolors="none", edgecolors=FIRED_COLOR, linewidths=2, zorder=3)
        line.set_markersize(5)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_title(metric, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def current_vs_baseline(results: list[dict[str, Any]], path: Path) -> Path | None:
    """Per recipe, current / baseline for every metric both have (1 = unchanged); red where a rule fired."""
    compared = [r for r in results if r["baseline"] and r["status"] == "ok"]
    if not compared:
        return None
    plt = _pyplot()
    rows = max(len(set(r["metrics"]) & set(r["baseline"]["metrics"])) for r in compared)
    fig, axes = plt.subplots(len(compared), 1, figsize=(7, (0.28 * rows + 0.6) * len(compared) + 0.3), dpi=90,
                             squeeze=False)
    for ax, result in zip(axes[:, 0], compared):
        base, now = result["baseline"]["metrics"], result["metrics"]
        metrics = sorted(m for m in set(now) & set(base) if base[m])
        fired = {f.get("metric") for f in result["fired"]}
        values = [now[m] / base[m] for m in metrics]
        ax.barh(metrics, values, color=[FIRED_COLOR if m in fired else OK_COLOR for m in metrics])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{result['recipe']}: current / baseline (night {result['baseline']['night_id']})", fontsize=9)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
