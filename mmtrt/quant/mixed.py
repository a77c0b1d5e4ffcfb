"""Mixed precision under a size budget: which quantized linears stay in float.

Sensitivity is each linear's measured relative output error after quantization, ||X (W_q - W)^T||^2 / ||X W^T||^2
on the calibration inputs (through their Gram matrix), or its task sensitivity per byte (mmtrt/quant/fisher.py); the
most sensitive linears stay in float, greedily in that order, each while the bytes it adds (its float weight less
its INT4 form) still fit the budget.
"""

from __future__ import annotations


def keep_float(candidates: list[tuple[str, float, int]], budget: int) -> list[str]:
    """Names of the linears that stay in float, from (name, relative output error, extra bytes) triples."""
    kept, spent = [], 0
    for name, _, extra in sorted(candidates, key=lambda c: (-c[1], c[0])):
        if spent + extra <= budget:
            kept.append(name)
            spent += extra
    return kept
