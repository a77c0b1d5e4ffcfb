"""Wall time of `mmtrt nightly scripts/nightly.yaml` with a cold and a warm build cache, alternated (cold, warm,
cold, warm, ...) so that load from other jobs on a shared host hits both alike; prints medians and their ratio
and draws the runs. Each cold run starts from an empty cache and history; each warm run follows its cold one.

    python scripts/bench_nightly.py [--pairs 2] [--plot docs/nightly/cold-vs-warm.png]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "scripts" / "nightly.yaml"


def night(config: Path, out: Path) -> tuple[float, dict]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mmtrt.cli", "nightly", str(config), "-o", str(out), "--json"],
                          capture_output=True, text=True, env={**os.environ, "MMTRT_NO_PROGRESS": "1"})
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"nightly failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return wall, json.loads(proc.stdout)


def config_in(folder: Path) -> Path:
    """scripts/nightly.yaml with its paths made absolute and its cache and history in `folder`."""
    data = yaml.safe_load(CONFIG.read_text())
    for entry in data["recipes"]:
        entry["recipe"] = str((CONFIG.parent / entry["recipe"]).resolve())
    data["benchmark"]["image"] = str((CONFIG.parent / data["benchmark"]["image"]).resolve())
    data.update(cache=str(folder / "cache"), history=str(folder / "history.sqlite"))
    path = folder / "nightly.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2.8), dpi=90)
    colors = {"cold": "#c0392b", "warm": "#2e86c1"}
    ax.bar(range(len(runs)), [r["wall_s"] for r in runs], color=[colors[r["cache"]] for r in runs])
    ax.set_xticks(range(len(runs)), [f"{r['cache']} {i // 2 + 1}" for i, r in enumerate(runs)], fontsize=8)
    ax.set_ylabel("wall time (s)")
    ax.set_title(f"mmtrt nightly scripts/nightly.yaml ({runs[0]['recipes']} recipes), cold vs warm cache", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    runs = []
    for _ in range(args.pairs):
        with tempfile.TemporaryDirectory(prefix="bench-nightly-") as tmp:
            config = config_in(Path(tmp))
            for kind in ("cold", "warm"):
                wall, data = night(config, Path(tmp) / f"report-{kind}")
                compiled = sum(r["cache"] == "miss" for r in data["results"])
                runs.append({"cache": kind, "wall_s": round(wall, 1), "compiled": compiled,
                             "recipes": len(data["results"])})
                print(json.dumps(runs[-1]), flush=True)
    cold = statistics.median(r["wall_s"] for r in runs if r["cache"] == "cold")
    warm = statistics.median(r["wall_s"] for r in runs if r["cache"] == "warm")
    print(f"median cold {cold:.1f} s, warm {warm:.1f} s, warm/cold {warm / cold:.2f}")
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
