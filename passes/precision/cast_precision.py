"""cast_precision: run the TensorRT segments in fp16 or bf16, keeping in fp32 what needs fp32.

TensorRT 11 builds strongly typed networks only: a layer runs in the type of its tensors in the ONNX, so reduced
precision has to be written into the graph. The pass lowers the float nodes of every TensorRT segment and keeps
in fp32 the ops that accumulate or normalise (the configured op types), the residual sums (Adds that feed, or
are fed by, the input of a normalisation) and position arithmetic (float math that depends on no float input of
the graph: rotary angles, masks). Attention runs lowered with `softmax_precision` set to fp32. DequantizeLinear
nodes and the nodes of ONNX Runtime segments are left as they are, and every component keeps its input and
output types, so the contracts between components do not change.
"""

from __future__ import annotations

from collections import Counter

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mmtrt.backends.tensorrt.support import SUPPORTED, TYPED_TENSOR
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.graph import node_inputs
from mmtrt.partition.placement import TENSORRT, graph_facts, place_component
from mmtrt.pipeline.pass_base import Pass
from passes.precision.cast_precision_config import CastPrecisionConfig, NORMALIZATIONS

LOW = {"fp16": (TensorProto.FLOAT16, np.float16), "bf16": (TensorProto.BFLOAT16, ml_dtypes.bfloat16)}
# Ops that only move or select data: they take the type of their data input instead of forcing one.
MOVES = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Gather", "GatherElements",
                   "GatherND", "Concat", "Split", "Expand", "Tile", "Identity", "Pad", "DepthToSpace", "SpaceToDepth",
                   "Where"})
NEVER = frozenset({"Cast", "CastLike", "Constant", "DequantizeLinear", "QuantizeLinear"})
# Inputs that stay fp32 whatever the node runs in.
FP32_INPUTS = {"Resize": {1, 2}}
SOFTMAX_FP32 = ("Attention",)


class CastPrecision(Pass):
    name = "cast_precision"
    Config = CastPrecisionConfig
    components = ("vision", "embed", "llm")
    provides = frozenset({"precision.reduced"})
    lossy = True

    def plan_facts(self, facts: dict) -> dict:
        """The LLM's float type, which kv_layout after this pass stores the cache in."""
        return {**facts, "float_type": {"fp16": "float16", "bf16": "bfloat16"}[self.config.dtype]}

    def run(self, ir: ModelIR) -> dict:
        return {name: self._lower(ir.components[name]) for name in self.components}

    def _lower(self, comp) -> dict:
        placement = place_component(comp)
        on_tensorrt = {i for s in placement.segments if s.backend == TENSORRT for i in s.nodes}
        model = comp.onnx
        types = graph_facts(model).types
        low_type, _ = LOW[self.config.dtype]
        modes, why = self._decide(model, types, on_tensorrt, low_type)
        bytes_before = _float_bytes(model)
        casts, converted = _rewrite(model, types, modes, low_type, self.config.dtype)
        return {
            "dtype": self.config.dtype,
            "nodes_lowered": sum(modes),
            "kept_fp32": dict(sorted(Counter(why.values()).items())),
            "initializers_converted": converted,
            "casts_inserted": casts,
            "float_weight_bytes_before": bytes_before,
            "float_weight_bytes_after": _float_bytes(model),
        }

    def _decide(self, model, types, on_tensorrt, low_type) -> tuple[list[bool], dict[int, str]]:
        """Per node, whether it runs lowered; for float nodes of TensorRT segments kept in fp32, the reason."""
        graph = model.graph
        activations = _activations(graph, types)
        residual = _residual_adds(graph) if self.config.keep_residual_fp32 else set()
        keep = set(self.config.keep_fp32_ops)
        low_now: set[str] = set()
        modes, why = [], {}
        for i, node in enumerate(graph.node):
            computes_float = _typed_dtype(node, types) == TensorProto.FLOAT and node.op_type not in NEVER
            reason = None
            if not computes_float or i not in on_tensorrt:
                reason = "onnxruntime segment" if computes_float else None
            elif low_type not in SUPPORTED.get(node.op_type, ()):
                reason = f"{node.op_type} has no {TensorProto.DataType.Name(low_type)} in TensorRT"
            elif node.op_type in keep:
                reason = node.op_type
            elif i in residual:
                reason = "residual add"
            elif not any(o in activations for o in node.output):
                reason = "position arithmetic"
            elif node.op_type in MOVES and not any(n in low_now for n in node.input):
                reason = "moves fp32 data"
            lowered = computes_float and reason is None
            if lowered:
                low_now.update(o for o in node.output if types.get(o) == TensorProto.FLOAT)
            elif reason:
                why[i] = reason
            modes.append(lowered)
        return modes, why


def _typed_dtype(node, types) -> int | None:
    where = TYPED_TENSOR.get(node.op_type, 0)
    names = node.output if where == "out" else node.input
    index = 0 if where == "out" else where
    return types.get(names[index]) if len(names) > index and names[index] else None


def _activations(graph, types) -> set[str]:
    """Tensors computed from a float input of the graph (weights alone do not count)."""
    reached = {v.name for v in graph.input if types.get(v.name) == TensorProto.FLOAT}
    for node in graph.node:
        if any(n in reached for n in node_inputs(node)):
            reached.update(o for o in node.output if o)
    return reached


def _residual_adds(graph) -> set[int]:
    """Adds on the residual stream: their output, or one of their inputs, is what a normalisation reads."""
    stream = {n.input[0] for n in graph.node if n.op_type in NORMALIZATIONS}
    return {i for i, n in enumerate(graph.node)
            if n.op_type == "Add" and (n.output[0] in stream or any(x in stream for x in n.input))}


def _float_bytes(model) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer
               if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16))


def _rewrite(model, types, modes, low_type, label) -> tuple[int, int]:
    """Give every node inputs of the type it runs in: weights read only by lowered nodes are converted, other
    tensors get one shared Cast per type; lowered outputs of the graph are cast back to fp32."""
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    readers: dict[str, set[bool]] = {}
    for node, lowered in zip(graph.node, modes):
        for k, name in enumerate(node.input):
            if name and k not in FP32_INPUTS.get(node.op_type, ()):
                readers.setdefault(name, set()).add(lowered)
    converted = [n for n, t in weights.items() if t.data_type == TensorProto.FLOAT and readers.get(n) == {True}]
    for name in converted:
        _convert_weight(weights[name], LOW[label][1])
    current = {name: types.get(name) for name in types}
    current.update({name: low_type for name in converted})
    casts: dict[tuple[str, int], str] = {}
    nodes = []
    for node, lowered in zip(list(graph.node), modes):
        for k, name in enumerate(node.input):
            if not name or types.get(name) != TensorProto.FLOAT or k in FP32_INPUTS.get(node.op_type, ()):
                continue
            want = low_type if lowered else TensorProto.FLOAT
            if current.get(name) != want:
                node.input[k] = _cast(nodes, casts, name, want, label)
        if lowered:
            current.update({o: low_type for o in node.output if types.get(o) == TensorProto.FLOAT})
            if node.op_type in SOFTMAX_FP32:
                _set_attr(node, "softmax_precision", TensorProto.FLOAT)
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    restored = _restore_outputs(graph, current)
    _retype_value_info(graph, current)
    return len(casts) + restored, len(converted)


def _convert_weight(tensor: onnx.TensorProto, np_type) -> None:
    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np_type), tensor.name))


def _cast(nodes, casts, name, to, label) -> str:
    key = (name, to)
    if key not in casts:
        casts[key] = f"{name}__{label if to != TensorProto.FLOAT else 'fp32'}"
        nodes.append(helper.make_node("Cast", [name], [casts[key]], to=to, name=f"{casts[key]}_cast"))
    return casts[key]


def _set_attr(node, name, value) -> None:
    for a in node.attribute:
        if a.name == name:
            node.attribute.remove(a)
            break
    node.attribute.append(helper.make_attribute(name, value))


def _restore_outputs(graph, current) -> int:
    """A graph output now made in the reduced type is renamed inside the graph and cast back under its name."""
    count = 0
    for out in graph.output:
        if current.get(out.name) in (TensorProto.FLOAT, None) or out.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        inner = f"{out.name}__reduced"
        for node in graph.node:
            for names in (node.input, node.output):
                for k, n in enumerate(names):
                    if n == out.name:
                        names[k] = inner
        graph.node.append(helper.make_node("Cast", [inner], [out.name], to=TensorProto.FLOAT, name=f"{out.name}_restore"))
        current[inner] = current.pop(out.name)
        count += 1
    return count


def _retype_value_info(graph, current) -> None:
    for v in graph.value_info:
        if v.name in current and current[v.name] is not None:
            v.type.tensor_type.elem_type = current[v.name]
