"""AWQ's scales folded into the graph: every group computes x/s times W diag(s), a float graph with the same outputs.

The group's weights take s on their input channels; 1/s goes into the normalisation that made x (its weight and
bias), into the output channels of the linear that made one factor of x, or into a pre-quant Mul. A linear's
folded weight is computed from its own initializer (a reference to the source model, or its bytes) when it is
asked for (`Folds.weight`), one linear at a time, so no float32 copy of the component is ever held. The graph's
node edits and the small initializers they read (norm weights, pre-quant scales) wait for `apply`: until then
every calibration session of a later layer reads the unmodified float graph. New initializers throughout: the
exporter shares identical ones between nodes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mmtrt.ir import source_weights
from mmtrt.quant.linears import GraphIndex, Group, Linear


class Folds:
    """The scales folded so far: per linear, the factors its weight takes in order, and the graph edits."""

    def __init__(self, index: GraphIndex, linears: list[Linear]):
        self.index = index
        self._weights = {id(lin.node): index.initializers[lin.weight] for lin in linears}  # as exported
        self.factors: dict[int, list[tuple[bool, np.ndarray]]] = {}  # id(node) -> (on input channels?, s)
        self.initializers: list[onnx.TensorProto] = []  # norm weights and biases, pre-quant scales, in group order
        self._norms: list[tuple[onnx.NodeProto, int, str]] = []  # (norm, input slot, new initializer)
        self._inserts: dict[int, onnx.NodeProto] = {}  # node position -> the pre-quant Mul before it
        self._inputs: dict[int, str] = {}  # id(linear node) -> the pre-quant Mul's output it reads

    def add(self, group: Group, s: np.ndarray) -> tuple[str, np.ndarray | None] | None:
        """Fold the group's scale; returns (how, the pre-quant scale when a Mul applies it), None when s = 1."""
        if np.all(s == 1):
            return None
        for lin in group.linears:
            self.factors.setdefault(id(lin.node), []).append((True, s))
        kind, target = group.absorber or (None, None)
        if kind == "norm":
            self._fold_into_norm(target, s, group.linears[0].name)
            return ("norm", None)
        if kind == "linear":
            self.factors.setdefault(id(target.node), []).append((False, s))
            return (f"output channels of {target.name}", None)
        inv = (1.0 / s).astype(self.dtype(group.linears[0]))
        name = f"{group.linears[0].name}.prequant_scale"
        self.initializers.append(numpy_helper.from_array(inv, name))
        out = f"{group.input}.awq_prequant"
        first = min(group.linears, key=lambda lin: self.index.position[id(lin.node)])
        self._inserts[self.index.position[id(first.node)]] = helper.make_node("Mul", [group.input, name], [out],
                                                                              name=f"{name}.mul")
        self._inputs.update((id(lin.node), out) for lin in group.linears)
        return ("prequant Mul", inv)

    def touched(self, lin: Linear) -> bool:
        return id(lin.node) in self.factors

    def input(self, lin: Linear) -> str:
        """The tensor the linear reads once the folds apply."""
        return self._inputs.get(id(lin.node), lin.input)

    def weight(self, lin: Linear, columns: slice | None = None) -> np.ndarray:
        """The linear's weight `[K, N]` as stored (its output channels `columns` alone, when given), with its
        factors folded in (in float32, in the order the groups folded them), in the graph's float type."""
        w = source_weights.array(self._weights[id(lin.node)], columns)
        if w.dtype != np.float32 or not w.flags.writeable:  # a referenced weight is widened into a new array
            w = w.astype(np.float32)
        outputs = slice(None) if columns is None else columns
        for on_inputs, s in self.factors.get(id(lin.node), []):
            if on_inputs:
                w *= s[:, None]
            else:
                w /= s[None, outputs]
        return w.astype(self.dtype(lin), copy=False)

    def dtype(self, lin: Linear) -> np.dtype:
        """The linear's float type (fp32, or fp16/bf16 after cast_precision): its scales and pre-quant scale take it."""
        return helper.tensor_dtype_to_np_dtype(self._weights[id(lin.node)].data_type)

    def apply(self, linears: list[Linear]) -> dict[int, list[onnx.NodeProto]]:
        """Point the graph's nodes at the folded tensors (a touched linear at `{name}.awq_weight`, which the caller
        adds unless it lowers the linear); returns the pre-quant Muls to insert, by node position."""
        for norm, slot, name in self._norms:
            norm.input[slot] = name
        for lin in linears:
            if id(lin.node) in self._inputs:
                lin.node.input[0] = self._inputs[id(lin.node)]
            if self.touched(lin):
                lin.weight = lin.node.input[1] = awq_weight_name(lin)
        return {i: [mul] for i, mul in self._inserts.items()}

    def _fold_into_norm(self, norm: onnx.NodeProto, s: np.ndarray, label: str) -> None:
        for i, suffix in ((1, "weight"), (2, "bias")):
            if len(norm.input) > i and norm.input[i]:
                value = source_weights.array(self.index.initializers[norm.input[i]])
                name = f"{label}.awq_norm_{suffix}"
                self.initializers.append(numpy_helper.from_array((value / s).astype(value.dtype), name))
                self._norms.append((norm, i, name))


def awq_weight_name(lin: Linear) -> str:
    return f"{lin.name}.awq_weight"

