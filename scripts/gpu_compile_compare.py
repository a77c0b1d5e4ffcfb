"""The GPU check's compile-cuda comparison: the bundle `mmtrt compile --device cuda` wrote against the CPU compile's.
The same bytes pass; otherwise every ONNX component runs on ONNX Runtime's CPU provider on the same random feeds
(mmtrt.compare.inputs) in both bundles, and its outputs must agree within the component's precision's tolerance.

Usage: python scripts/gpu_compile_compare.py CPU_BUNDLE CUDA_BUNDLE
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 5e-2}  # max |a - b| / max |b|, per output


def main(cpu: Path, cuda: Path) -> int:
    import onnxruntime as ort

    from mmtrt.bundle.manifest import read_manifest
    from mmtrt.compare.inputs import generate

    a, b = read_manifest(cpu), read_manifest(cuda)
    differ = sorted(k for k in set(a["artifacts"]) | set(b["artifacts"]) if a["artifacts"].get(k) != b["artifacts"].get(k))
    if not differ:
        print(f"PASS compile-cuda: the same bytes ({len(a['artifacts'])} artifacts)")
        return 0
    worst, ok = {}, True
    for name, comp in a["components"].items():
        if not comp["artifact"].endswith(".onnx"):
            continue
        dtype = (comp.get("precision") or {}).get("dtype", "fp32")
        sessions = [ort.InferenceSession(str(p / comp["artifact"]), providers=["CPUExecutionProvider"]) for p in (cpu, cuda)]
        for feed in generate(a, name, np.random.default_rng())[:3]:
            ours, theirs = (s.run(None, feed) for s in sessions)
            for x, y in zip(theirs, ours):
                rel = float(np.abs(x.astype(np.float64) - y).max() / max(np.abs(y).max(), 1e-12))
                worst[name] = max(worst.get(name, 0.0), rel)
        ok &= worst[name] <= TOLERANCE.get(dtype, 1e-4)
    print(f"{'PASS' if ok else 'FAIL'} compile-cuda: {len(differ)} artifacts differ in bytes; worst relative output "
          f"difference per component: " + ", ".join(f"{k} {v:.1e}" for k, v in sorted(worst.items())))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
