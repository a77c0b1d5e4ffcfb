"""GPTQ against an independent reference: the greedy least-squares definition of its recurrence (each column rounded,
then every later column re-solved by numpy's lstsq so that the output on the calibration inputs, damped as GPTQ
damps H, is as close to the float output as the already rounded columns allow), on a fresh random layer."""

import numpy as np
import pytest

from mmtrt.quant.cholesky import inverse_upper_factor
from mmtrt.quant.gptq import DAMP, gptq_quantize, output_error
from mmtrt.quant import int4
from mmtrt.quant.int4 import Grid, dequantize_groups


def _reference(w: np.ndarray, x: np.ndarray, grid: Grid) -> np.ndarray:
    """Rounded q by the least-squares definition: A = [X; sqrt(lambda) I] so that A^T A = H + lambda I."""
    k = w.shape[1]
    gram = x.T @ x
    a = np.vstack([x, np.sqrt(DAMP * np.mean(np.diag(gram))) * np.eye(k)])
    target = a @ w.T
    current = w.astype(np.float64).copy()
    q = np.zeros(w.shape, np.int8)
    scale = zero = None
    for j in range(k):
        if j % grid.group == 0:
            _, scale, zero = grid.quantize(current[:, j:j + grid.group].astype(np.float32))
        s, z = scale[:, 0].astype(np.float64), None if zero is None else zero[:, 0].astype(np.float64)
        if grid.symmetric:
            q[:, j] = np.clip(np.rint(current[:, j] / s), -8, 7)
            deq = q[:, j] * s
        else:
            q[:, j] = np.clip(np.rint(current[:, j] / s) + z, 0, 15)
            deq = (q[:, j] - z) * s
        current[:, j] = deq
        if j + 1 < k:
            rest = target - a[:, :j + 1] @ current[:, :j + 1].T
            current[:, j + 1:] = np.linalg.lstsq(a[:, j + 1:], rest, rcond=None)[0].T
    return q


@pytest.mark.parametrize("rows_a_block", [None, 5])
@pytest.mark.parametrize("symmetric", [True, False])
def test_gptq_matches_the_least_squares_recurrence_and_beats_rtn(rng, symmetric, rows_a_block, monkeypatch):
    """Whole, or a block of 5 output channels at a time (as a wide lm_head goes): each row's recurrence is its
    own."""
    n, k, tokens = 12, 48, 200
    if rows_a_block:
        monkeypatch.setattr(int4, "ROW_BLOCK_ELEMENTS", rows_a_block * k)
    grid = Grid(16, symmetric)
    # correlated inputs with uneven channel scales, as activations are: compensation has something to use
    x = rng.normal(size=(tokens, k)) @ rng.normal(size=(k, k)) * rng.uniform(0.2, 3, size=k)
    w = rng.normal(size=(n, k)).astype(np.float32)
    q, scales, zp = gptq_quantize(w, x.T @ x, grid)
    np.testing.assert_array_equal(q, _reference(w, x, grid))
    gptq = dequantize_groups(q, scales, zp, grid.group)
    rtn = grid.fake(w)
    assert output_error(w, gptq.__getitem__, x.T @ x) < 0.8 * output_error(w, rtn.__getitem__, x.T @ x)


def test_the_output_error_a_block_of_rows_at_a_time_is_the_whole_weights(rng, monkeypatch):
    """Summed over blocks of output channels (a 7B lm_head's float64 products were 3 GB at once), the relative
    output error is ||X (W_hat - W)^T||^2 / ||X W^T||^2 computed on the captured inputs themselves."""
    monkeypatch.setattr(int4, "ROW_BLOCK_ELEMENTS", 3 * 40)
    x = rng.normal(size=(300, 40))
    w = rng.normal(size=(17, 40)).astype(np.float32)
    w_hat = Grid(8).fake(w)
    asked = []
    got = output_error(w, lambda rows: asked.append(rows) or w_hat[rows], x.T @ x)
    want = np.square(x @ (w_hat - w).T.astype(np.float64)).sum() / np.square(x @ w.T.astype(np.float64)).sum()
    assert len(asked) == 6 and np.isclose(got, want, rtol=1e-10, atol=0)


def test_one_column_left_takes_the_closed_form_update(rng):
    """With two input channels, after rounding the first the second moves by (w0 - q0) H01 / H11 (damped H)."""
    x = rng.normal(size=(64, 2)) @ np.array([[1.0, 0.8], [0.0, 0.6]])
    w = rng.normal(size=(5, 2)).astype(np.float32)
    grid = Grid(16)
    q, scales, _ = gptq_quantize(w, x.T @ x, grid)
    h = x.T @ x
    h[np.diag_indices(2)] += DAMP * np.mean(np.diag(h))
    s = scales[:, 0].astype(np.float64)
    w1 = w[:, 1] + (w[:, 0] - q[:, 0] * s) * h[0, 1] / h[1, 1]
    np.testing.assert_array_equal(q[:, 1], np.clip(np.rint(w1 / s), -8, 7))


def test_dead_input_channels_quantize_to_zero(rng):
    x = rng.normal(size=(100, 32))
    x[:, 5] = 0
    w = rng.normal(size=(4, 32)).astype(np.float32)
    q, _, _ = gptq_quantize(w, x.T @ x, Grid(16))
    assert np.all(q[:, 5] == 0) and np.any(q != 0)


def _act_order_reference(w: np.ndarray, x: np.ndarray, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
    """Act-order by the least-squares definition: columns by decreasing diagonal of X^T X, each rounded on its
    group's scale taken from the untouched weights, then every column not yet rounded re-solved by lstsq."""
    k = w.shape[1]
    gram = x.T @ x
    a = np.vstack([x, np.sqrt(DAMP * np.mean(np.diag(gram))) * np.eye(k)])
    target = a @ w.T
    _, scale, _ = grid.quantize(w)
    current = w.astype(np.float64).copy()
    q = np.zeros(w.shape, np.int8)
    order = sorted(range(k), key=lambda c: -gram[c, c])
    for i, c in enumerate(order):
        s = scale[:, c // grid.group].astype(np.float64)
        q[:, c] = np.clip(np.rint(current[:, c] / s), -8, 7)
        current[:, c] = q[:, c] * s
        rest_cols = order[i + 1:]
        if rest_cols:
            rest = target - a[:, order[:i + 1]] @ current[:, order[:i + 1]].T
            current[:, rest_cols] = np.linalg.lstsq(a[:, rest_cols], rest, rcond=None)[0].T
    return q, scale


@pytest.mark.parametrize("rows_a_block", [None, 4])
def test_act_order_matches_the_least_squares_recurrence_with_static_groups(rng, rows_a_block, monkeypatch):
    n, k, tokens = 10, 48, 200
    if rows_a_block:
        monkeypatch.setattr(int4, "ROW_BLOCK_ELEMENTS", rows_a_block * k)
    grid = Grid(16)
    x = rng.normal(size=(tokens, k)) @ rng.normal(size=(k, k)) * rng.uniform(0.2, 3, size=k)
    w = rng.normal(size=(n, k)).astype(np.float32)
    q, scales, zp = gptq_quantize(w, x.T @ x, grid, act_order=True)
    ref_q, ref_scales = _act_order_reference(w, x, grid)
    np.testing.assert_array_equal(scales, ref_scales)
    np.testing.assert_array_equal(q, ref_q)
    assert zp is None
    natural = dequantize_groups(*gptq_quantize(w, x.T @ x, grid), grid.group)
    assert not np.array_equal(dequantize_groups(q, scales, zp, grid.group), natural)  # the order changed something


def test_the_inverse_hessians_factor_is_numpys_computed_in_the_hessians_memory(rng):
    """U with H^-1 = U^T U, written into the damped Hessian's own memory, equals numpy's cholesky(inv(H)).T; a
    matrix that is not positive definite raises as numpy's did."""
    k = 300
    x = rng.normal(size=(k + 40, k)) * rng.uniform(0.1, 3, size=k)
    h = x.T @ x
    want = np.linalg.cholesky(np.linalg.inv(h)).T
    held = h.copy()
    u = inverse_upper_factor(held)
    assert np.shares_memory(u, held) and np.array_equal(np.tril(u, -1), np.zeros_like(u))
    np.testing.assert_allclose(u, want, rtol=0, atol=1e-12 * np.abs(want).max())
    few = rng.normal(size=(50, k))
    with pytest.raises(np.linalg.LinAlgError):
        inverse_upper_factor(few.T @ few - np.eye(k))
