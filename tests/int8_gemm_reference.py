"""The integer product sum((a - zero) * b) of uint8 codes `a` [M, K] and int8 weights `b` [K, N] as this host's ONNX
Runtime computes it: exactly where its GEMM is VNNI's; where it is not, each two neighbouring products along K
added in 16 bits with saturation first (vpmaddubsw; mmtrt/backends/int8_gemm.py)."""

import numpy as np

from mmtrt.backends.int8_gemm import saturates


def host_integer_product(a: np.ndarray, b: np.ndarray, zero: int = 128) -> np.ndarray:
    a, b = a.astype(np.int64), b.astype(np.int64)
    if not saturates():
        return (a - zero) @ b
    if a.shape[1] % 2:
        a, b = np.pad(a, ((0, 0), (0, 1))), np.pad(b, ((0, 1), (0, 0)))
    pairs = a[:, 0::2, None] * b[None, 0::2] + a[:, 1::2, None] * b[None, 1::2]
    return np.clip(pairs, -32768, 32767).sum(axis=1) - zero * b.sum(axis=0)
