"""AWQ's two searches (Lin et al., MLSys 2024): the per-input-channel scale of a group of linears, then the
clipping range of every weight group. Weights are in PyTorch's layout `[N, K]`.

Scale search: s = mean|x|^alpha over alpha in {0, 0.05, ..., 0.95}, normalised by sqrt(max(s) min(s)); the
candidate with the least output error wins. Alpha 0 is s = 1, round-to-nearest itself, so the chosen scale is
never worse than RTN on the calibration data. The error is measured at the output of the module the group feeds
(`ModuleLoss`: the attention block for q/k/v, the MLP for gate/up, run by ONNX Runtime on the graph's own nodes)
or, for a group that feeds the residual stream, at its own outputs (`OwnLoss`, exact through the Gram matrix of
its inputs, so every calibration token counts at no extra cost; `Quadratic` evaluates it through the Gram
matrix's Cholesky factor, computed once per group).

Clip search: for every output channel and weight group, the range max|w| * (1 - i/20), i = 0..9, with the least
error of that group's share of the output, ||X_g (Q(w_g) - w_g)||^2, again through the Gram matrix (the caller
keeps the clipping only when the module's error drops too).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from mmtrt.quant.cholesky import lower_factor
from mmtrt.quant.session import session
from mmtrt.quant.int4 import Grid, num_groups, row_blocks
from mmtrt.quant.linears import GraphIndex, Group, region_inputs

ALPHAS = np.arange(20) / 20
CLIP_RATIOS = 1 - np.arange(10) / 20


@dataclass
class GroupStats:
    """What calibration keeps of one group's input: sum of |x| per channel, the token count, X^T X (whole when the
    error is measured at the group's own outputs, else only its diagonal blocks of `group` channels, which is all
    the clip search needs), and for groups with a module the region's feeds on the search batches."""

    abs_sum: np.ndarray
    gram: np.ndarray
    full: bool
    group: int
    tokens: int = 0
    feeds: list[dict[str, np.ndarray]] = field(default_factory=list)

    @classmethod
    def empty(cls, k: int, group: int, full: bool) -> "GroupStats":
        g = num_groups(k, group)
        return cls(np.zeros(k), np.zeros((k, k) if full else (g, group, group)), full, group)

    def add(self, x: np.ndarray) -> None:
        x = x.reshape(-1, x.shape[-1]).astype(np.float32)
        self.abs_sum += np.abs(x).sum(0)
        self.tokens += x.shape[0]
        if self.full:
            self.gram += x.T @ x
            return
        g = self.gram.shape[0]
        xg = np.pad(x, ((0, 0), (0, g * self.group - x.shape[1]))).reshape(x.shape[0], g, self.group).transpose(1, 0, 2)
        self.gram += xg.transpose(0, 2, 1) @ xg

    def take_gram(self) -> np.ndarray:
        """X^T X, which the stats no longer hold (a Llama-2-7B down_proj's is 0.97 GB)."""
        gram, self.gram = self.gram, None
        return gram

    def blocks(self) -> np.ndarray:
        """The diagonal blocks [G, group, group] of X^T X (the short last group padded with zeros)."""
        if not self.full:
            return self.gram
        k = self.gram.shape[0]
        g = num_groups(k, self.group)
        padded = np.pad(self.gram, ((0, g * self.group - k), (0, g * self.group - k)))
        return np.stack([padded[i * self.group:(i + 1) * self.group, i * self.group:(i + 1) * self.group]
                         for i in range(g)])


def effective_weight(w: np.ndarray, s: np.ndarray, grid: Grid, clip=None) -> np.ndarray:
    """What the quantized linear computes on the unscaled input: Q(W diag(s)) diag(1/s)."""
    return grid.fake(w * s, clip) / s


class OwnLoss:
    """Mean squared error of the group's own outputs, sum over tokens of ||x (W_eff - W)^T||^2 = tr(D G D^T); it
    takes the Gram matrix out of the stats (the caller takes what else it needs of it first). The sum runs over
    blocks of output channels (`row_blocks`), so a wide linear (a 151,936-row lm_head) is never held scaled,
    rounded or subtracted whole; each weight is `[N, K]`, an array or anything that gives its rows by slice."""

    def __init__(self, weights: list, stats: GroupStats):
        self.weights, self.quadratic = weights, Quadratic(stats.take_gram())
        self.count = stats.tokens * sum(w.shape[0] for w in weights)
        self.energy = sum(self.quadratic(w[rows]) for w in weights for rows in row_blocks(*w.shape)) / self.count

    def __call__(self, effective: list[np.ndarray]) -> float:
        return sum(self.quadratic(e - w[:]) for e, w in zip(effective, self.weights)) / self.count

    def at(self, s: np.ndarray, grid: Grid, clips=None) -> float:
        """The error of the weights scaled by `s` and rounded (with each linear's clip ratios [N, G])."""
        clips = clips or [None] * len(self.weights)
        return sum(self.quadratic(effective_weight(w[rows], s, grid, None if c is None else c[rows]) - w[rows])
                   for w, c in zip(self.weights, clips) for rows in row_blocks(*w.shape)) / self.count


class Quadratic:
    """tr(D G D^T) for the many D of one Gram matrix G (every alpha's and the clipped weights' errors), through
    G's Cholesky factor, computed once: G = L L^T, so the sum is ||D L||^2, and L's column blocks skip its zero
    upper triangle (for D [N, K], about 0.56 N K^2 multiply-adds instead of D G's N K^2). A channel that never
    fires has a zero row and column in G and adds nothing, so it is left out; where G is still not positive
    definite in float32 (fewer tokens than channels), G itself is used. It takes over a float64 `gram`
    (mmtrt/quant/cholesky.py factors it in place)."""

    BLOCKS = 8

    def __init__(self, gram: np.ndarray):
        live = np.diag(gram) > 0
        self.live = None if live.all() else np.flatnonzero(live)
        g = gram if self.live is None else gram[np.ix_(self.live, self.live)]
        self.lower, self.gram = lower_factor(np.asarray(g, np.float64))
        k = g.shape[0]
        self.edges = np.linspace(0, k, min(self.BLOCKS, k) + 1).astype(int)

    def __call__(self, d: np.ndarray) -> float:
        if self.live is not None:
            d = d[:, self.live]
        if self.lower is None:
            return float(np.einsum("nk,nk->", d @ self.gram, d, dtype=np.float64))
        total = 0.0
        for a, b in zip(self.edges[:-1], self.edges[1:]):
            part = d[:, a:] @ self.lower[a:, a:b]
            total += float(np.einsum("nk,nk->", part, part, dtype=np.float64))
        return total


class ModuleLoss:
    """Mean squared error at the module output: the region between the group's input and the module output runs
    in ONNX Runtime with the group's weights as inputs, on the calibration feeds kept for the search."""

    def __init__(self, model: onnx.ModelProto, index: GraphIndex, group: Group, weights: list[np.ndarray],
                 feeds: list[dict[str, np.ndarray]]):
        self.weights, self.names = weights, [lin.weight for lin in group.linears]
        self.dtypes = [helper.tensor_dtype_to_np_dtype(index.initializers[n].data_type) for n in self.names]
        self.session = session(_region_model(model, index, group, feeds[0]))
        self.feeds = feeds
        self.reference = [self._run(f, weights) for f in feeds]
        self.count = sum(r.size for r in self.reference)
        self.energy = sum(float(np.square(r, dtype=np.float64).sum()) for r in self.reference) / self.count

    def _run(self, feeds: dict[str, np.ndarray], weights: list[np.ndarray]) -> np.ndarray:
        given = {name: np.ascontiguousarray(w.T, dtype) for name, w, dtype in zip(self.names, weights, self.dtypes)}
        return self.session.run(None, {**feeds, **given})[0].astype(np.float32)

    def __call__(self, effective: list[np.ndarray]) -> float:
        total = sum(float(np.square(self._run(f, effective) - r, dtype=np.float64).sum())
                    for f, r in zip(self.feeds, self.reference))
        return total / self.count

    def at(self, s: np.ndarray, grid: Grid, clips=None) -> float:
        clips = clips or [None] * len(self.weights)
        return self([effective_weight(w, s, grid, c) for w, c in zip(self.weights, clips)])


def _region_model(model: onnx.ModelProto, index: GraphIndex, group: Group,
                  example: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The module's nodes as a graph of their own: input, side inputs and the group's weights in, module out."""
    names = region_inputs(index, group)
    weights = [lin.weight for lin in group.linears]
    used = {n for node in group.region for n in node.input}
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(example[n].dtype), None)
              for n in names]
    inputs += [helper.make_tensor_value_info(w, index.initializers[w].data_type, None) for w in weights]
    inits = [t for name, t in index.initializers.items() if name in used and name not in weights]
    graph = helper.make_graph(group.region, "module", inputs, [helper.make_empty_tensor_value_info(group.module_output)],
                              inits)
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)


@dataclass
class ScaleResult:
    scale: np.ndarray
    alpha: float
    rtn_loss: float
    loss: float
    energy: float


def search_scale(stats: GroupStats, loss, grid: Grid) -> ScaleResult:
    """The alpha whose scale gives the least module-output error (`loss`: an OwnLoss or a ModuleLoss of the
    group's weights); alpha 0 (s = 1) is round-to-nearest."""
    x_mean = stats.abs_sum / max(stats.tokens, 1)
    best = None
    rtn_loss = 0.0
    for alpha in ALPHAS:
        s = scale_for(x_mean, alpha)
        err = loss.at(s, grid)
        if alpha == 0:
            rtn_loss = err
        if best is None or err < best[0]:
            best = (err, alpha, s)
    err, alpha, s = best
    return ScaleResult(s, float(alpha), rtn_loss, err, loss.energy)


def scale_for(x_mean: np.ndarray, alpha: float) -> np.ndarray:
    s = np.maximum(x_mean, 1e-4) ** alpha
    return (s / np.sqrt(s.max() * s.min())).astype(np.float32)


def search_clip(w: np.ndarray, s: np.ndarray, blocks: np.ndarray, grid: Grid) -> np.ndarray:
    """Per output channel and weight group of the scaled weight `w` diag(s), the clip ratio [N, G] with the least
    error of that group's output share; `blocks` are the diagonal blocks of the Gram matrix of x / s. Searched
    over blocks of output channels (`row_blocks`)."""
    blocks = blocks.astype(np.float32)
    return np.concatenate([_clip_rows(w[rows] * s, blocks, grid) for rows in row_blocks(*w.shape)])


def _clip_rows(w: np.ndarray, blocks: np.ndarray, grid: Grid) -> np.ndarray:
    n, k = w.shape
    group = grid.group
    g = num_groups(k, group)
    pad = g * group - k
    best = np.full((g, n), np.inf)
    ratio = np.ones((g, n), np.float32)
    for r in CLIP_RATIOS:
        d = np.pad(grid.fake(w, r) - w, ((0, 0), (0, pad))).reshape(n, g, group).transpose(1, 0, 2)
        err = np.einsum("gni,gni->gn", d @ blocks, d)
        better = err < best
        best[better], ratio[better] = err[better], r
    return ratio.T


def scaled_blocks(blocks: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The Gram blocks of x / s (the input the scaled weight sees)."""
    g, group = blocks.shape[:2]
    inv = np.pad(1.0 / s.astype(np.float64), (0, g * group - s.size)).reshape(g, group)
    return blocks * inv[:, :, None] * inv[:, None, :]
