"""What verifying a bundle at load costs: the full sha256 of every artifact, the cached check by file identity,
and `runtime.load` with and without verification, on one bundle (default: the 700 MB dino-smollm bundle).

The configurations alternate within every round (A B C D, A B C D, ...) and the medians are printed with their
ratios to a load without verification. The files are in the page cache after the first round, so the numbers are
those of a warm load; a cold first load also reads the files from disk, which ONNX Runtime then does anyway.
One ONNX Runtime thread, spinning off; the machine may be shared, so the ratios matter more than the seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ["MMTRT_CACHE"] = tempfile.mkdtemp(prefix="bench-verify-")

from mmtrt.bundle import verify  # noqa: E402
from mmtrt.bundle.manifest import read_manifest  # noqa: E402
from mmtrt.runtime import pipeline  # noqa: E402


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("bundle", nargs="?", default="/work/bundles/dino-smollm.bundle", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    manifest = read_manifest(args.bundle)
    size = sum((args.bundle / name).stat().st_size for name in manifest["artifacts"])
    real_verify = pipeline.verify_bundle

    def load(check: str | None):
        checks = {"cached": real_verify, "full": lambda b, m: real_verify(b, m, full=True), None: lambda b, m: None}
        pipeline.verify_bundle = checks[check]
        pipeline.load(args.bundle, threads=1, spin=False)

    configs = {
        "full sha256 (first load, mmtrt verify)": lambda: verify.verify_bundle(args.bundle, manifest, full=True),
        "cached check (file identity)": lambda: verify.verify_bundle(args.bundle, manifest),
        "load without verification": lambda: load(None),
        "load with the cached check (default)": lambda: load("cached"),
        "load with the full sha256": lambda: load("full"),
    }
    times = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, fn in configs.items():
            times[name].append(timed(fn))
    base = statistics.median(times["load without verification"])
    print(f"{args.bundle}: {len(manifest['artifacts'])} artifacts, {size / 1e6:.0f} MB; medians of {args.rounds}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<40} {1e3 * med:9.1f} ms  {med / base:6.3f}x a load without verification")
    print(f"  full hash throughput {size / 1e6 / statistics.median(times[next(iter(configs))]):.0f} MB/s")


if __name__ == "__main__":
    main()
