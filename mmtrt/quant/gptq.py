"""GPTQ (Frantar et al., ICLR 2023): quantize a linear's input columns one at a time and move each column's rounding
error onto the columns not yet quantized, weighted by the inverse Hessian H = X^T X of the linear's input, so that
the output error ||X (W - Q)^T||^2 stays near the least-squares optimum of the already rounded columns.

As the reference code: H is damped by 1 % of its mean diagonal, input channels that never fire are zeroed, the
recurrence runs on the upper Cholesky factor of H^-1, and each group's scale is taken from the group's weights as
compensated by every earlier group, when its first column comes up (a block is one group, so the block's lazy update
lands before the next group's scale is chosen). Columns are taken in their natural order, or with `act_order` in
order of decreasing H diagonal (the channels that see the most energy first, while the most later columns can still
absorb their error) with static groups: each group's scale is taken up front from the uncompensated weights, so the
groups stay contiguous in the stored form, as DequantizeLinear and MatMulNBits need (the reference code's
`desc_act` with `static_groups`). Weights are in PyTorch's layout `[N, K]`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from mmtrt.quant.cholesky import inverse_upper_factor
from mmtrt.quant.int4 import Grid, quantize_columns, row_blocks

DAMP = 0.01


def damped(hessian: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """H + 1 % of its mean diagonal, dead channels (zero diagonal) given 1; and the dead channels' mask."""
    h = np.array(hessian, np.float64)
    dead = np.diag(h) == 0
    h[dead, dead] = 1
    h[np.diag_indices_from(h)] += DAMP * np.mean(np.diag(h))
    return h, dead


def gptq_quantize(w: np.ndarray, hessian: np.ndarray, grid: Grid,
                  act_order: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """INT4 of `w` [N, K] with error compensation under `hessian` [K, K]: (q, scales, zero points) as
    `Grid.quantize` returns them. Each output channel's recurrence is its own, so the rows go a block at a time
    (`row_blocks`), on one factor of H^-1: a 32,000 x 4,096 lm_head in float64 is 1 GB."""
    h, dead = damped(hessian)
    order = np.argsort(-np.diag(h), kind="stable") if act_order else None
    u = inverse_upper_factor(h if order is None else h[np.ix_(order, order)])  # H^-1 = U^T U, in column order
    del h
    q = np.empty(w.shape, np.int8)
    scales, zero_points = [], []
    for rows in row_blocks(*w.shape):
        block = np.array(w[rows], np.float64)
        block[:, dead] = 0
        q[rows], s, z = _compensated(block, u, grid) if order is None else _static_groups(block, u, order, grid)
        scales.append(s)
        zero_points.append(z)
    zp = None if zero_points[0] is None else np.concatenate(zero_points)
    return q, np.concatenate(scales), zp


def _compensated(w: np.ndarray, u: np.ndarray, grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """GPTQ's recurrence on the rows `w` (float64, changed in place) in natural column order."""
    n, k = w.shape
    q = np.zeros((n, k), np.int8)
    scales, zero_points = [], []
    for start in range(0, k, grid.group):
        end = min(start + grid.group, k)
        block = w[:, start:end].copy()
        _, s, z = grid.quantize(block.astype(np.float32))
        scales.append(s)
        zero_points.append(z)
        errors = np.zeros_like(block)
        for j in range(end - start):
            q[:, start + j], deq = quantize_columns(block[:, j], s[:, 0], None if z is None else z[:, 0], grid)
            errors[:, j] = (block[:, j] - deq) / u[start + j, start + j]
            block[:, j + 1:] -= np.outer(errors[:, j], u[start + j, start + j + 1:end])
        w[:, end:] -= errors @ u[start:end, end:]
    zp = None if zero_points[0] is None else np.concatenate(zero_points, axis=1)
    return q, np.concatenate(scales, axis=1), zp


def _static_groups(w: np.ndarray, u: np.ndarray, order: np.ndarray,
                   grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Act-order GPTQ on the rows `w`: the columns taken in `order` (decreasing H diagonal; `u` factors H^-1 in
    that order), each rounded on its own group's up-front scale, the error moved onto the columns after it."""
    _, scales, zero_points = grid.quantize(w.astype(np.float32))
    w = w[:, order]
    q = np.zeros(w.shape, np.int8)
    for start in range(0, w.shape[1], grid.group):
        end = min(start + grid.group, w.shape[1])
        block = w[:, start:end].copy()
        errors = np.zeros_like(block)
        for j in range(end - start):
            column = order[start + j]
            g = column // grid.group
            q[:, column], deq = quantize_columns(block[:, j], scales[:, g],
                                                 None if zero_points is None else zero_points[:, g], grid)
            errors[:, j] = (block[:, j] - deq) / u[start + j, start + j]
            block[:, j + 1:] -= np.outer(errors[:, j], u[start + j, start + j + 1:end])
        w[:, end:] -= errors @ u[start:end, end:]
    return q, scales, zero_points


def output_error(w: np.ndarray, w_hat: Callable[[slice], np.ndarray], hessian: np.ndarray) -> float:
    """||X (W_hat - W)^T||^2 / ||X W^T||^2 through the Gram matrix, where `w_hat(rows)` gives the approximation's
    output channels `rows`; summed a block of rows at a time, as the rounding goes (a 32,000 x 4,096 lm_head's
    float64 products took 3 GB at once)."""
    error = energy = 0.0
    for rows in row_blocks(*w.shape):
        d = (w_hat(rows) - w[rows]).astype(np.float64)
        own = w[rows].astype(np.float64)
        error += np.einsum("nk,nk->", d @ hessian, d)
        energy += np.einsum("nk,nk->", own @ hessian, own)
    return float(error / max(energy, 1e-30))
