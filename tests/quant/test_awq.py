"""AWQ's searches on synthetic data: a salient input channel is what the scale search protects, alpha 0 is RTN,
every clip ratio chosen is at least as good as no clipping for its own weight group, and a wide linear searched a
block of output channels at a time (and widened so from where the compile keeps it) gets what it gets whole."""

import numpy as np
import onnx
import pytest

from builders import tiny_llm_feeds
from mmtrt.ir import source_weights, spill
from mmtrt.ir.graph import Component
from mmtrt.quant import cholesky, int4, quantize
from mmtrt.quant.awq import (CLIP_RATIOS, GroupStats, OwnLoss, Quadratic, effective_weight, scaled_blocks, search_clip,
                            search_scale)
from mmtrt.quant.int4 import Grid
from mmtrt.quant.layer_rewrite import LayerRewrite
from mmtrt.quant.linears import find_linears
from mmtrt.quant.lowering import Settings


def _stats(x, group, full=True):
    stats = GroupStats.empty(x.shape[1], group, full)
    stats.add(x)
    return stats


def test_scale_search_protects_a_salient_channel(rng):
    w = rng.normal(size=(64, 128)).astype(np.float32)
    x = rng.normal(size=(512, 128)).astype(np.float32)
    x[:, rng.integers(128)] *= 50
    grid, stats = Grid(32), _stats(x, 32)
    loss = OwnLoss([w], stats)
    result = search_scale(stats, loss, grid)
    assert result.alpha > 0 and result.loss < 0.7 * result.rtn_loss
    assert np.isclose(result.rtn_loss, loss([grid.fake(w)]))
    np.testing.assert_allclose(result.rtn_loss, np.mean((x @ (grid.fake(w) - w).T) ** 2), rtol=1e-3)


def test_alpha_zero_wins_when_rtn_is_exact(rng):
    """Weights already on the grid: RTN has no error, so no scale can win."""
    grid = Grid(32, symmetric=False, float_zero_point=True)
    w = grid.fake(rng.normal(size=(16, 64)).astype(np.float32))
    x = rng.normal(size=(256, 64)).astype(np.float32) * rng.uniform(0.1, 10, size=64).astype(np.float32)
    stats = _stats(x, 32)
    result = search_scale(stats, OwnLoss([w], stats), grid)
    assert result.alpha == 0 and result.loss == result.rtn_loss < 1e-10


def test_clip_ratios_never_lose_on_their_own_group(rng):
    w = rng.standard_t(3, size=(24, 96)).astype(np.float32)  # heavy tails: clipping pays somewhere
    x = rng.normal(size=(300, 96)).astype(np.float32)
    s = rng.uniform(0.5, 2.0, size=96).astype(np.float32)
    grid = Grid(32)
    blocks = scaled_blocks(_stats(x, 32, full=False).blocks(), s)
    ratio = search_clip(w, s, blocks, grid)
    assert ratio.shape == (24, 3) and set(np.unique(ratio)) <= set(CLIP_RATIOS.astype(np.float32)) and ratio.min() < 1
    xs = (x / s).reshape(300, 3, 32)

    def group_errors(clip):
        d = (grid.fake(w * s, clip) - w * s).reshape(24, 3, 32)
        return np.einsum("tgi,ngi->tng", xs, d) ** 2

    assert (group_errors(ratio).sum(0) <= group_errors(None).sum(0) * (1 + 1e-4) + 1e-6).all()
    np.testing.assert_allclose(effective_weight(w, s, grid, ratio) * s, grid.fake(w * s, ratio), rtol=1e-5, atol=1e-6)


def test_quadratic_through_the_factor_is_the_output_error(rng):
    """tr(D G D^T) through G's Cholesky factor equals ||X D^T||^2 computed from the inputs themselves: for a Gram
    of more tokens than channels, with a channel that never fires (left out), and of fewer tokens than channels
    (not positive definite: G itself is used)."""
    d = rng.normal(size=(40, 96)).astype(np.float32)
    for tokens, dead in ((500, False), (500, True), (60, False)):
        x = rng.normal(size=(tokens, 96)).astype(np.float32) * rng.uniform(0.1, 10, size=96).astype(np.float32)
        if dead:
            x[:, 7] = 0
        quadratic = Quadratic(_stats(x, 32).gram)
        assert (quadratic.lower is None) == (tokens < 96) and (quadratic.live is not None) == dead
        expected = np.square(x.astype(np.float64) @ d.T.astype(np.float64)).sum()
        np.testing.assert_allclose(quadratic(d), expected, rtol=1e-5)


def test_blocks_of_output_channels_search_as_the_whole_weight(rng, monkeypatch):
    """The own-output error, the clip search and the scale search over blocks of 10 rows (a 151,936-row lm_head's
    way) against the same on the whole weight."""
    w = [rng.standard_t(3, size=(45, 96)).astype(np.float32), rng.normal(size=(8, 96)).astype(np.float32)]
    x = rng.normal(size=(300, 96)).astype(np.float32) * rng.uniform(0.1, 10, size=96).astype(np.float32)
    s = rng.uniform(0.5, 2.0, size=96).astype(np.float32)
    grid = Grid(32)
    blocks = scaled_blocks(_stats(x, 32, full=False).blocks(), s)

    def searched():
        loss = OwnLoss(w, _stats(x, 32))
        clips = [search_clip(v, s, blocks, grid) for v in w]
        return loss.energy, loss.at(s, grid, clips), clips, search_scale(_stats(x, 32), OwnLoss(w, _stats(x, 32)), grid)

    whole = searched()
    monkeypatch.setattr(int4, "ROW_BLOCK_ELEMENTS", 10 * 96)
    assert len(int4.row_blocks(*w[0].shape)) == 5
    parts = searched()
    np.testing.assert_allclose(parts[:2], whole[:2], rtol=1e-6)
    for a, b in zip(parts[2], whole[2]):
        np.testing.assert_array_equal(a, b)
    assert parts[3].alpha == whole[3].alpha
    np.testing.assert_allclose(parts[3].loss, whole[3].loss, rtol=1e-6)
    direct = sum(np.square(x.astype(np.float64) @ (effective_weight(v, s, grid, c) - v).T.astype(np.float64)).sum()
                 for v, c in zip(w, whole[2])) / (300 * 53)
    np.testing.assert_allclose(parts[1], direct, rtol=1e-4)


def test_a_linear_searched_at_its_own_outputs_is_widened_a_block_of_rows_at_a_time(tiny_bundle, rng, tmp_path,
                                                                                    monkeypatch):
    """awq_int4 reads the weights it searches at their own outputs (the lm_head, the down projections) from where
    the compile keeps them (the checkpoint, or here the scratch file) a block of output channels at a time, and
    writes the same graph as from the whole weights."""
    feeds = tiny_llm_feeds(rng)
    settings = Settings("awq", Grid(32), True, "matmulnbits", 0, 64, lambda name: True)
    monkeypatch.setattr(int4, "ROW_BLOCK_ELEMENTS", 16 * 128)
    monkeypatch.setattr(spill, "MIN_BYTES", 1024)
    widest, read = {}, source_weights.array

    def recorded(tensor, columns=None):
        out = read(tensor, columns)
        widest[tensor.name] = max(widest.get(tensor.name, 0), out.shape[-1])
        return out
    monkeypatch.setattr(source_weights, "array", recorded)

    def quantized(weight):
        monkeypatch.setattr(quantize, "_weight", weight)
        comp = Component("llm", [], [], onnx=onnx.load(tiny_bundle / "llm.onnx"))
        with source_weights.kept(), spill.scratch(tmp_path):
            spill.spill(comp)
            widest.clear()
            quantize.quantize_component(comp.onnx, "llm", [feeds], settings)
            source_weights.materialize(comp.onnx)
        return comp.onnx.SerializeToString(), dict(widest)

    weight = quantize._weight
    by_rows, widths = quantized(weight)
    whole, _ = quantized(lambda tensor, lazy: weight(tensor, False))
    assert by_rows == whole
    head = next(lin for lin in find_linears(onnx.load(tiny_bundle / "llm.onnx"), "llm")[1] if lin.role == "lm_head")
    assert head.n > 100 and widths[head.weight] == 16


def test_the_gram_factor_is_numpys_and_a_matrix_not_positive_definite_comes_back_whole(rng, monkeypatch):
    """The factor computed in the Gram matrix's own memory equals numpy's Cholesky of the float32 matrix; a Gram
    matrix of fewer tokens than channels (not positive definite once rounded) is handed back as it was."""
    k = 300
    x = rng.normal(size=(k + 40, k)).astype(np.float32) * rng.uniform(0.1, 3, size=k).astype(np.float32)
    gram = x.T.astype(np.float64) @ x
    want = np.linalg.cholesky(gram.astype(np.float32))
    monkeypatch.setattr(cholesky, "BAND", 7 * k)  # bands of 7 rows: rounding, copying and mirroring in pieces
    lower, none = cholesky.lower_factor(gram.copy())
    np.testing.assert_allclose(lower, want, rtol=0, atol=1e-6 * np.abs(want).max())
    assert none is None and np.array_equal(np.triu(lower, 1), np.zeros_like(lower))
    few = rng.normal(size=(50, k)).astype(np.float32)
    singular = few.T.astype(np.float64) @ few
    singular[np.diag_indices(k)] += 1e-9  # positive on the diagonal, rank 50
    none, whole = cholesky.lower_factor(singular.copy())
    assert none is None and np.array_equal(whole, singular.astype(np.float32))


@pytest.mark.parametrize("lowering, suffix", [("matmulnbits", ".B"), ("dequantize_linear", ".weight")])
def test_int4_weights_go_to_the_scratch_file_as_their_layer_is_rounded_under_as_made(tiny_bundle, rng, tmp_path,
                                                                                     monkeypatch, lowering, suffix):
    """Where no later pass lists the component (`spill.as_made`), each linear's packed INT4 weight (MatMulNBits' or
    DequantizeLinear's int4) joins the graph as a reference to the scratch file when its layer is rounded, so a 7B
    LLM's INT4 weights are not held to the end of the pass; the graph is the same bytes."""
    feeds = tiny_llm_feeds(rng)
    settings = Settings("rtn", Grid(32), True, lowering, 0, 64, lambda name: True)
    monkeypatch.setattr(spill, "MIN_BYTES", 1024)
    packed_at_finish, finish = [], LayerRewrite.finish

    def recorded(self):
        packed = [t for t in self.model.graph.initializer if t.name.endswith(suffix)
                  and (source_weights.reference_bytes(t) or len(t.raw_data)) >= 1024]
        packed_at_finish.append(sorted({source_weights.is_reference(t) for t in packed}))
        return finish(self)
    monkeypatch.setattr(LayerRewrite, "finish", recorded)

    def quantized(as_made: bool):
        comp = Component("llm", [], [], onnx=onnx.load(tiny_bundle / "llm.onnx"))
        with source_weights.kept(), spill.scratch(tmp_path), spill.as_made([comp.onnx] if as_made else []):
            quantize.quantize_component(comp.onnx, "llm", [feeds], settings)
            source_weights.materialize(comp.onnx)
        return comp.onnx.SerializeToString()

    assert quantized(True) == quantized(False)
    assert packed_at_finish == [[True], [False]]
