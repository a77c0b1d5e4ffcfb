"""Peak memory and time of GPTQ's inverse-Hessian factor at a linear's input width, numpy's inv and cholesky against
the in-place LAPACK path (mmtrt/quant/cholesky.py), each in a fresh interpreter, side by side.

    python scripts/bench_gptq_factor.py --width 11008   # a Llama-2-7B down projection's input
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import numpy as np

from mmtrt.quant.cholesky import inverse_upper_factor

FORMS = {"numpy inv + cholesky": lambda h: np.linalg.cholesky(np.linalg.inv(h)).T, "in place": inverse_upper_factor}


def _hessian(width: int, band: int = 256) -> np.ndarray:
    """A symmetric positive definite float64 matrix (random, diagonally dominant), made a band of rows at a time so
    that making it leaves no larger peak than the matrix itself."""
    rng = np.random.default_rng(0)
    h = np.empty((width, width))
    for a in range(0, width, band):
        h[a:a + band] = rng.uniform(-1, 1, (min(band, width - a), width))
        h[a:a + band, :a] = h[:a, a:a + band].T
        h[a:a + band, a:a + band] = np.triu(h[a:a + band, a:a + band]) + np.triu(h[a:a + band, a:a + band], 1).T
    h[np.diag_indices(width)] += width
    return h


def one(form: str, width: int) -> tuple[float, float]:
    """(peak resident GB above the damped Hessian's, seconds) of one factor in this interpreter."""
    h = _hessian(width)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    u = FORMS[form](h)
    seconds = time.perf_counter() - start
    assert u.shape == (width, width)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base) / 1e9, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=11008)
    parser.add_argument("--form", choices=FORMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.form:
        print(*one(args.form, args.width))
        return
    rows = {}
    for form in FORMS:
        out = subprocess.run([sys.executable, __file__, "--width", str(args.width), "--form", form],
                             capture_output=True, text=True, check=True).stdout.split()
        rows[form] = tuple(map(float, out))
    matrix = args.width ** 2 * 8 / 1e9
    print(f"| factor ({args.width} x {args.width}, the float64 matrix {matrix:.2f} GB) | peak above the matrix GB | s |")
    print("| --- | ---: | ---: |")
    for form, (peak, seconds) in rows.items():
        print(f"| {form} | {peak:.2f} | {seconds:.1f} |")
    (old, old_s), (new, new_s) = rows.values()
    print(f"in place / numpy: memory {new / old:.2f}x, time {new_s / old_s:.2f}x")


if __name__ == "__main__":
    main()
