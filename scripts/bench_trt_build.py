"""TensorRT engines of the shipped recipes, built with TensorRT-RTX on this host (no GPU): per TensorRT segment
whether TensorRT's parser takes it, whether it builds, the build time, the engine's size against its ONNX's, and
which nodes placement left on ONNX Runtime and why.

    python scripts/bench_trt_build.py --work /tmp/trt-bench [--recipes recipes/tiny-llava.yaml ...]

Bundles are compiled into WORK (reused when WORK/<recipe>.bundle holds a bundle of the same recipe; a recipe's
`evaluate` and `budgets` are left out, which changes no graph) and every segment is built afresh (`--force`). dino-smollm compiles take minutes and several GB: run it alone. Prints a
Markdown table (docs/results/tensorrt-build.md) and writes WORK/tensorrt-build.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from collections import Counter
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ["tiny-llava", "tiny-llava-fp16", "tiny-llava-static", "dino-smollm", "dino-smollm-fp16", "dino-smollm-int4-trt",
           "dino-smollm-static"]


def without_evaluation(recipe: Path, work: Path) -> Path:
    """The recipe less its `evaluate` and `budgets` (accuracy measured during the compile): the same graphs and
    engines, minutes less to compile."""
    import yaml

    text = yaml.safe_load(recipe.read_text())
    if "evaluate" not in text and "budgets" not in text:
        return recipe
    text = {k: v for k, v in text.items() if k not in ("evaluate", "budgets")}
    lean = work / recipe.name
    lean.write_text(yaml.safe_dump(text, sort_keys=False))
    return lean


def compiled(recipe: Path, work: Path) -> Path:
    from mmtrt.bundle.manifest import read_manifest
    from mmtrt.compiler import compile_recipe
    from mmtrt.recipe import load_recipe

    bundle = work / f"{recipe.stem}.bundle"
    digest = load_recipe(recipe)[0].digest()
    if (bundle / "manifest.json").is_file() and read_manifest(bundle)["recipe_sha256"] == digest:
        return bundle
    return compile_recipe(recipe, bundle, force=True)


def onnx_bytes(bundle: Path, entry: dict) -> int:
    """The segment's ONNX as TensorRT reads it: the parser's form (or the ONNX) and the external weights."""
    files = {entry.get("tensorrt_onnx", entry["onnx"]), *[f for f in entry["files"] if not f.endswith(".onnx")]}
    return sum((bundle / f).stat().st_size for f in files)


def on_onnxruntime(placement: dict) -> str:
    """Nodes of TensorRT-offered components that placement left on ONNX Runtime, by op and reason."""
    counts = Counter((n["op"], n["reason"]) for n in placement["nodes"]
                     if n["backend"] == "onnxruntime" and n["kind"] != "policy")
    return "; ".join(f"{c} x {op}: {why}" for (op, why), c in counts.most_common()) or "none"


def measure(recipe: Path, work: Path) -> list[dict]:
    from mmtrt.backends.tensorrt.build import build_engines
    from mmtrt.bundle.manifest import read_manifest

    bundle = compiled(without_evaluation(recipe, work), work)
    m = read_manifest(bundle)
    records = {r["segment"]: r for r in build_engines(bundle, force=True, target="rtx", log=lambda line: None)}
    rows = []
    for entry in m["tensorrt"]["segments"]:
        r = records[entry["id"]]
        rows.append({
            "recipe": recipe.stem, "segment": entry["id"], "precision": entry["precision"]["dtype"],
            "parsed": r["status"] == "built" or r.get("stage") not in ("parse", "plan", "plugins"),
            "built": r["status"] == "built", "status": r["status"], "reason": r.get("reason"),
            "build_seconds": r.get("build_seconds"), "engine_bytes": r.get("engine_bytes"),
            "onnx_bytes": onnx_bytes(bundle, entry),
            "on_onnxruntime": on_onnxruntime(m["placement"][entry["component"]]),
        })
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| recipe | segment | precision | parsed | built | build s | engine MiB | ONNX MiB | engine / ONNX | "
             "nodes on ONNX Runtime (why) |", "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        engine, onnx = r["engine_bytes"], r["onnx_bytes"]
        cells = [r["recipe"], r["segment"], r["precision"], "yes" if r["parsed"] else "no",
                 "yes" if r["built"] else f"no: {r['reason']}", r["build_seconds"] if r["built"] else "-",
                 f"{engine / 2**20:.1f}" if engine else "-", f"{onnx / 2**20:.1f}",
                 f"{engine / onnx:.2f}" if engine else "-", r["on_onnxruntime"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the compiled bundles")
    parser.add_argument("--recipes", type=Path, nargs="+",
                        default=[ROOT / "recipes" / f"{name}.yaml" for name in RECIPES])
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    import tensorrt_rtx

    rows = [row for recipe in args.recipes for row in measure(recipe, args.work)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"{date.today()}, commit {commit.strip()}, {platform.node()} ({platform.machine()}, no GPU), "
          f"TensorRT-RTX {tensorrt_rtx.__version__}, Python {sys.version.split()[0]}\n")
    print(table(rows))
    (args.work / "tensorrt-build.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["built"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
