"""How much each unit (channel, head or KV group) of a dependency group matters, and which to keep.

`l2`: DepGraph's group norm. Each member's per-unit squared norm is divided by its mean over the units (so a wide
member does not drown a narrow one) and the members' shares are summed.
`activation`: Minitron's width importance. The mean magnitude over calibration tokens of the unit's activations
at the input of the linear that consumes the group (the MLP's hidden activations, the heads' attention output).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from mmtrt.prune.groups import PruneGroup
from mmtrt.quant.session import run_with_outputs


def l2_scores(model: onnx.ModelProto, group: PruneGroup) -> np.ndarray:
    initializers = {t.name: t for t in model.graph.initializer}
    total = np.zeros(group.units)
    for member in group.members:
        array = numpy_helper.to_array(initializers[member.name]).astype(np.float64)
        blocks = np.moveaxis(array, member.axis, 0).reshape(group.units, member.width, -1)
        share = np.square(blocks).sum(axis=(1, 2))
        total += share / share.mean() if share.mean() > 0 else share
    return total


def activation_stats(model: onnx.ModelProto, groups: list[PruneGroup],
                     batches: Iterable[dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per group label, over every calibration token: the mean |activation| of each unit (its importance) and the
    mean of each activation entry (what bias compensation puts in place of a removed one)."""
    sums = {g.label: np.zeros(g.units * g.activation_width) for g in groups}
    abs_sums = {g.label: np.zeros(g.units * g.activation_width) for g in groups}
    tokens = 0
    for outputs in run_with_outputs(model, [g.activation for g in groups], list(batches)):
        for g in groups:
            x = outputs[g.activation].reshape(-1, g.units * g.activation_width).astype(np.float64)
            sums[g.label] += x.sum(axis=0)
            abs_sums[g.label] += np.abs(x).sum(axis=0)
        tokens += int(np.prod(outputs[groups[0].activation].shape[:-1]))
    scores = {g.label: (abs_sums[g.label] / tokens).reshape(g.units, -1).mean(axis=1) for g in groups}
    return scores, {label: total / tokens for label, total in sums.items()}


def kept_units(scores: np.ndarray, count: int) -> np.ndarray:
    """The `count` best units, ties to the lower index, in ascending index order."""
    order = np.argsort(-scores, kind="stable")
    return np.sort(order[:count])


def kept_count(units: int, ratio: float, kind: str, multiple: int) -> int:
    """Units left after removing `ratio` of them: channels round to a multiple of `multiple` (at least one
    multiple, at most all), heads and KV groups to a whole count of at least one."""
    if ratio == 0:
        return units
    if kind == "heads":
        return max(1, round(units * (1 - ratio)))
    return min(units, max(multiple, round(units * (1 - ratio) / multiple) * multiple))
