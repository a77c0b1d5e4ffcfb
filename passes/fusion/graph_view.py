"""A read-only view of a graph for pattern matching: producers, consumers, constants, and which nodes TensorRT runs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from mmtrt.ir.rewrite import attr


class NoMatch(Exception):
    """A candidate that is not the pattern, with the reason."""


class NotCandidate(Exception):
    """A node of the anchor's type that does not start the pattern at all (not reported)."""


@dataclass
class GraphView:
    graph: onnx.GraphProto
    on_tensorrt: set[int]  # node indices in TensorRT segments
    types: dict[str, int]
    shapes: dict[str, list]

    def __post_init__(self):
        self.index = {n.output[0]: i for i, n in enumerate(self.graph.node) if n.output}
        self.made = {o: n for n in self.graph.node for o in n.output if o}
        self.uses: dict[str, int] = {}
        for n in self.graph.node:
            for name in n.input:
                self.uses[name] = self.uses.get(name, 0) + 1
        for o in self.graph.output:
            self.uses[o.name] = self.uses.get(o.name, 0) + 1
        self.weights = {t.name: t for t in self.graph.initializer}

    def producer(self, name: str, op_type: str, skip_casts: bool = False) -> onnx.NodeProto:
        node = self.made.get(name)
        while skip_casts and node is not None and node.op_type == "Cast" and op_type != "Cast":
            node = self.made.get(node.input[0])
        if node is None or node.op_type != op_type:
            raise NoMatch(f"{name} is not made by a {op_type}")
        return node

    def on_trt(self, node: onnx.NodeProto) -> bool:
        return self.index.get(node.output[0]) in self.on_tensorrt

    def single_use(self, name: str) -> None:
        if self.uses.get(name, 0) != 1:
            raise NoMatch(f"{name} has {self.uses.get(name, 0)} consumers (the fusion would remove a tensor another node reads)")

    def const(self, name: str) -> np.ndarray:
        if name in self.weights:
            return numpy_helper.to_array(self.weights[name])
        node = self.made.get(name)
        if node is not None and node.op_type == "Constant":
            return numpy_helper.to_array(node.attribute[0].t)
        raise NoMatch(f"{name} is not a constant")


def attribute(node: onnx.NodeProto, name: str, default=None):
    return attr(node, name, default)


def check(condition: bool, why: str) -> None:
    if not condition:
        raise NoMatch(why)
