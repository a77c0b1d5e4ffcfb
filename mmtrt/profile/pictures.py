"""The report's pictures (matplotlib, Agg, PNG): each function takes the numbers and a path and writes one file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

DPI = 80


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    _plt().close(fig)
    return path


def waterfall(stages: dict[str, Any], path: Path, title: str) -> Path:
    """Each stage a bar starting where the previous one ended: the request's timeline."""
    plt = _plt()
    names = [s for s, v in stages.items() if v is not None]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(names) + 1.2))
    start = 0.0
    for i, name in enumerate(names):
        v = stages[name]
        ax.barh(i, v["median"], left=start, color=f"C{i}")
        ax.text(start + v["median"], i, f" {v['median']:.1f} ms ({100 * v['share']:.0f} %)", va="center", fontsize=8)
        start += v["median"]
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, start * 1.3)
    ax.set_xlabel("ms (median over rounds)")
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def layer_bars(trace: dict[str, Any], path: Path) -> Path:
    """Kernel time per layer bucket, one panel per profiled graph that has layers."""
    plt = _plt()
    comps = [c for c, agg in trace["components"].items() if len(agg["per_layer_us"]) > 1]
    fig, axes = plt.subplots(1, len(comps), figsize=(4.2 * len(comps), 0.18 * max(
        len(trace["components"][c]["per_layer_us"]) for c in comps) + 1.5), squeeze=False)
    for ax, comp in zip(axes[0], comps):
        layers = trace["components"][comp]["per_layer_us"]
        ax.barh(range(len(layers)), [v / 1e3 for v in layers.values()], color="C0")
        ax.set_yticks(range(len(layers)), [k.split(".", 1)[1] for k in layers], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("kernel ms per request")
        ax.set_title(comp, fontsize=10)
    return _save(fig, path)


def head_heatmaps(heads: dict[str, Any], path: Path) -> Path:
    """Layers by heads: entropy and redundancy, for the vision tower and the LLM."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    comps = [c for c in ("vision", "llm") if heads.get(c)]
    fig, axes = plt.subplots(len(comps), 2, figsize=(8, 3.2 * len(comps)), squeeze=False)
    for row, comp in zip(axes, comps):
        for ax, key, cmap in zip(row, ("entropy", "redundancy"), ("viridis", "magma")):
            grid = np.array([layer[key] for layer in heads[comp]])
            im = ax.imshow(grid, aspect="auto", cmap=cmap, interpolation="nearest")
            ax.set_title(f"{comp}: {key}" + (" (nats)" if key == "entropy" else " (max cosine)"), fontsize=9)
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            fig.colorbar(im, ax=ax, fraction=0.046)
    return _save(fig, path)


def saliency_overlay(pixels: np.ndarray, scores: list[float], kept: dict[float, list[int]], path: Path,
                     label: str) -> Path:
    """The image as the model saw it, the saliency over its patches, and the patches kept at each keep ratio."""
    plt = _plt()
    image = np.moveaxis(pixels[0], 0, -1).astype(np.float64)
    image = (image - image.min()) / max(image.max() - image.min(), 1e-12)
    side = int(round(len(scores) ** 0.5))
    grid = np.asarray(scores).reshape(side, side)
    extent = (0, image.shape[1], image.shape[0], 0)
    fig, axes = plt.subplots(1, 1 + len(kept), figsize=(3.2 * (1 + len(kept)), 3.4))
    axes[0].imshow(image)
    axes[0].imshow(grid, cmap="inferno", alpha=0.6, extent=extent, interpolation="nearest")
    axes[0].set_title(label, fontsize=9)
    for ax, (keep, patches) in zip(axes[1:], kept.items()):
        mask = np.zeros(side * side)
        mask[patches] = 1
        ax.imshow(image)
        ax.imshow(mask.reshape(side, side), cmap="gray", alpha=0.55, extent=extent, interpolation="nearest",
                  vmin=0, vmax=1)
        ax.set_title(f"token_prune keep {keep}: {len(patches)} kept (light)", fontsize=9)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    return _save(fig, path)


def kv_context(rows: list[dict[str, Any]], path: Path) -> Path:
    """KV cache bytes (batch 1) and the measured decode step against context."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ctx = [r["context"] for r in rows]
    ax.plot(ctx, [r["kv_bytes"] / 2**20 for r in rows], "o-", color="C0")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("KV cache MiB", color="C0")
    measured = [r for r in rows if r["decode_step_ms"] is not None]
    if measured:
        twin = ax.twinx()
        twin.plot([r["context"] for r in measured], [r["decode_step_ms"] for r in measured], "s--", color="C3")
        twin.set_ylabel("decode step ms", color="C3")
    ax.set_title("KV cache and decode step against context", fontsize=10)
    return _save(fig, path)


def stage_ratios(names: list[str], ratios: dict[str, list[float | None]], path: Path) -> Path:
    """Per stage, each bundle's median time over the first bundle's."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    stages = list(ratios)
    width = 0.8 / max(len(names) - 1, 1)
    for k, name in enumerate(names[1:]):
        values = [ratios[s][k] or 0 for s in stages]
        ax.bar(np.arange(len(stages)) + k * width, values, width, label=f"{name} / {names[0]}")
    ax.axhline(1, color="gray", lw=0.8)
    ax.set_xticks(np.arange(len(stages)) + width * (len(names) - 2) / 2, stages, rotation=30, fontsize=8)
    ax.set_ylabel("time ratio")
    ax.legend(fontsize=8)
    return _save(fig, path)
