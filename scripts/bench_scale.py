"""What a compile costs per model size: random-weight checkpoints of real architectures (scripts/scale_models.py,
written tensor by tensor), each compiled losslessly and with awq_int4 in a subprocess; wall time, peak RSS and
bundle bytes as ratios to the checkpoint's bytes, and `mmtrt compare --reference torch` on one request.

    python scripts/bench_scale.py onevision-0.5b --work /tmp/scale [--layers 4 4] [--dtype bfloat16]
        [--recipes lossless awq_int4 int4_rtn] [--no-compare] [--reuse-checkpoint]

`--no-compare` where the float32 bundle and the PyTorch model do not fit in memory together (a 7B bundle is
28 GB of float32 weights, which `compare` loads into ONNX Runtime beside the source model).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from random_checkpoint import write_checkpoint
from scale_models import MODELS

RECIPES = {
    "lossless": "model: {{source: hf, path: {path}}}\n",
    "awq_int4": "model: {{source: hf, path: {path}}}\npasses:\n  - awq_int4: {{}}\n",
    "int4_rtn": "model: {{source: hf, path: {path}}}\npasses:\n  - awq_int4: {{method: rtn}}\n",
}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def compile_child(recipe: Path, bundle: Path) -> tuple[float, int, int]:
    """`mmtrt compile` in its own interpreter, which reports its own peak RSS; (wall seconds, peak bytes, exit code)."""
    code = ("import resource, sys; from mmtrt.cli import main; "
            f"rc = main(['compile', {str(recipe)!r}, '-o', {str(bundle)!r}, '--force']); "
            "print('peak', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    peak = [int(line.split()[1]) for line in done.stderr.splitlines() if line.startswith("peak ")]
    return time.perf_counter() - started, (peak[-1] if peak else 0) * 1024, done.returncode


def measure(name: str, work: Path, layers, dtype: torch.dtype, kinds: list[str], compare: bool,
            reuse: bool = False) -> list[dict]:
    model_class, config, processor, generation = MODELS[name](layers)
    checkpoint = work / name / "checkpoint"
    weights = ((checkpoint / "model.safetensors").stat().st_size if reuse else
               write_checkpoint(checkpoint, model_class, config, processor, generation, dtype))
    rows = []
    for kind in kinds:
        recipe = work / name / f"{kind}.yaml"
        recipe.write_text(RECIPES[kind].format(path=checkpoint))
        bundle = work / name / f"{kind}.bundle"
        wall, peak, rc = compile_child(recipe, bundle)
        report = work / name / f"{kind}.compare.json"
        compared = subprocess.run([sys.executable, "-m", "mmtrt.cli", "compare", str(bundle), "--reference", "torch",
                                   "--source-model", str(checkpoint), "--json-out", str(report)],
                                  capture_output=True, check=False).returncode if rc == 0 and compare else None
        rows.append({"model": name, "recipe": kind, "checkpoint_bytes": weights, "compile_s": round(wall, 1),
                     "peak_rss_bytes": peak, "peak_rss_ratio": round(peak / weights, 2), "bundle_ratio": round(folder_bytes(bundle) / weights, 2)
                     if rc == 0 else None, "compile_rc": rc, "compare_rc": compared})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--layers", type=int, nargs=2, metavar=("VISION", "TEXT"), help="fewer layers for a trial")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=["lossless"],
                        help="the recipes to compile (default: lossless)")
    parser.add_argument("--no-compare", action="store_true", help="skip `compare --reference torch`")
    parser.add_argument("--reuse-checkpoint", action="store_true",
                        help="compile the checkpoint an earlier run wrote to WORK/MODEL/checkpoint (same arguments)")
    args = parser.parse_args()
    measure(args.model, args.work, args.layers, getattr(torch, args.dtype), args.recipes, not args.no_compare,
            args.reuse_checkpoint)


if __name__ == "__main__":
    main()
