"""The Cholesky factor of a calibration Gram matrix, computed in the matrix's own memory.

numpy's `cholesky` of a float32 matrix computes in float64 and holds two float64 copies besides its input: for a
Llama-2-7B down projection's 11,008 input channels, 1.9 GB above the Gram matrix, the peak of an INT4 compile.
Here the float64 Gram matrix is rounded to float32 values in place (what numpy would factor) and LAPACK's dpotrf
factors it where it is, so the factor costs its float32 result alone. GPTQ's factor of the inverse Hessian is
computed in the damped Hessian's memory the same way.
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


def inverse_upper_factor(h: np.ndarray) -> np.ndarray:
    """U upper triangular with H^-1 = U^T U, for the symmetric positive definite float64 `h`, which this takes over
    (U is written into it): H's Cholesky factor, the inverse from it (LAPACK dpotri) and that inverse's factor, as
    GPTQ's reference implementation computes it, each in place. numpy's inv and then cholesky held three float64
    copies besides a 7B down projection's 11,008 x 11,008 matrix (2.95 GB above its 0.97 GB)."""
    a = h.T  # Fortran-ordered: LAPACK works on its lower triangle in place, and U = L^T is it read as C-ordered
    for step in (lambda m: lapack.dpotrf(m, lower=1, clean=0, overwrite_a=1),
                 lambda m: lapack.dpotri(m, lower=1, overwrite_c=1),
                 lambda m: lapack.dpotrf(m, lower=1, clean=1, overwrite_a=1)):
        a, info = step(a)
        if info != 0:
            raise np.linalg.LinAlgError(f"GPTQ's damped Hessian is not positive definite (LAPACK info {info})")
    return a.T
