"""Draw docs/images/flow.png, the README's picture of what mmtrt does: `python scripts/draw_flow.py`."""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "docs" / "images" / "flow.png"
# (x, y, title, detail): the compile steps in a row, then the runtimes
STEPS = [
    (0.0, 1.0, "recipe.yaml", "model, passes,\nenvelope, backends"),
    (2.1, 1.0, "IR", "preprocess, vision,\nembed, llm: ONNX\nwith named dims"),
    (4.2, 1.0, "passes", "prune, quantize,\nKV layout, fuse,\nprecision"),
    (6.3, 1.0, "partitions", "TorchVision, ONNX Runtime,\nTensorRT, TensorRT-LLM,\nshape profiles"),
    (8.4, 1.0, "bundle", "manifest + sha256,\nONNX, tokenizer,\nengine plans"),
]
RUNTIMES = [(10.5, 1.75, "Python runtime", "mmtrt run, load()"), (10.5, 0.25, "C++ runtime", "mmtrt-run, libmmtrt")]
WIDTH, HEIGHT = 1.85, 1.15


def box(ax, x: float, y: float, title: str, detail: str, colour: str) -> None:
    ax.add_patch(FancyBboxPatch((x, y - HEIGHT / 2), WIDTH, HEIGHT, boxstyle="round,pad=0.04", fc=colour, ec="#333333"))
    ax.text(x + WIDTH / 2, y + 0.3, title, ha="center", va="center", fontsize=11, weight="bold")
    ax.text(x + WIDTH / 2, y - 0.12, detail, ha="center", va="center", fontsize=7.2, linespacing=1.25)


def arrow(ax, start: tuple[float, float], end: tuple[float, float]) -> None:
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color="#333333", lw=1.3))


def draw(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(12.5, 2.9), dpi=110)
    for x, y, title, detail in STEPS:
        box(ax, x, y, title, detail, "#dbe8f6")
    for (x0, y0, *_), (x1, y1, *_) in zip(STEPS, STEPS[1:]):
        arrow(ax, (x0 + WIDTH + 0.03, y0), (x1 - 0.03, y1))
    for x, y, title, detail in RUNTIMES:
        box(ax, x, y, title, detail, "#e3f1dc")
        arrow(ax, (STEPS[-1][0] + WIDTH + 0.03, 1.0), (x - 0.03, y))
    ax.text(4.2 + WIDTH / 2, 1.0 + HEIGHT / 2 + 0.22, "mmtrt compile (any host, no GPU needed)", ha="center",
            fontsize=9, style="italic")
    ax.text(10.5 + WIDTH / 2, 2.55, "the target host", ha="center", fontsize=9, style="italic")
    ax.set_xlim(-0.1, 12.4)
    ax.set_ylim(-0.45, 2.75)
    ax.axis("off")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-o", "--output", type=Path, default=OUT)
    draw(parser.parse_args().output)


if __name__ == "__main__":
    main()
