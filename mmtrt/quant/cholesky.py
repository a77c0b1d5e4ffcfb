"""The Cholesky factor of a calibration Gram matrix, computed in the matrix's own memory.

numpy's `cholesky` of a float32 matrix computes in float64 and holds two float64 copies besides its input: for a
Llama-2-7B down projection's 11,008 input channels, 1.9 GB above the Gram matrix, the peak of an INT4 compile.
Here the float64 Gram matrix is rounded to float32 values in place (what numpy would factor) and LAPACK's dpotrf
factors it where it is, so the factor costs its float32 result alone.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import lapack

BAND = 1 << 22  # elements of a band of rows rounded, mirrored or copied at a time (32 MB of float64)


def lower_factor(gram: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(L, G) for the symmetric float64 `gram`, which this takes over: L float32 lower triangular with G = L L^T,
    and G the matrix in float32 only where it is not positive definite (L None); the other is None."""
    for rows in _bands(gram):
        gram[rows] = gram[rows].astype(np.float32)
    diagonal = np.diag(gram).copy()
    # gram.T is Fortran-ordered, and its upper triangle is gram's lower one: dpotrf overwrites it with L^T in place
    # and leaves gram's strict upper triangle as it was
    factor, info = lapack.dpotrf(gram.T, lower=0, clean=0, overwrite_a=1)
    if info != 0:
        _mirror_upper(gram, diagonal)
        return None, gram.astype(np.float32)
    factor = factor.T  # gram itself, unless LAPACK was handed a copy
    lower = np.empty(gram.shape, np.float32)
    for rows in _bands(factor):
        lower[rows] = np.tril(factor[rows], k=rows.start)
    return lower, None


def _bands(matrix: np.ndarray) -> list[slice]:
    step = max(1, BAND // max(matrix.shape[1], 1))
    return [slice(a, min(a + step, matrix.shape[0])) for a in range(0, matrix.shape[0], step)]


def _mirror_upper(gram: np.ndarray, diagonal: np.ndarray) -> None:
    """The symmetric matrix again from its untouched strict upper triangle and its saved diagonal."""
    for rows in _bands(gram):
        a, b = rows.start, rows.stop
        gram[a:b, :a] = gram[:a, a:b].T
        block = np.triu(gram[a:b, a:b], k=1)
        gram[a:b, a:b] = block + block.T + np.diag(diagonal[a:b])
