"""Segment artifacts: one ONNX file per segment of a split component, with the shapes TensorRT must accept.

A component that is one segment is its own artifact; a split component gets a file per segment (TensorRT and
ONNX Runtime alike), so a host can run any mix of engines and ONNX Runtime sessions, segment after segment.
A segment's weights are the component's: its file reads them from the component's external data, so the bundle
holds them once. ONNX and ONNX Runtime refuse an external data location outside the model's folder, hence the
segment files lie at the bundle's root, `<component>.<i>.segment.onnx`.
"""

from __future__ import annotations

import ast
import hashlib
import operator
from collections import Counter
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

from mmtrt.backends.tensorrt.parser_form import write_form
from mmtrt.bundle.manifest import sha256_file
from mmtrt.bundle.stored import StoredTensors
from mmtrt.bundle.writer import save_onnx
from mmtrt.ir.graph import node_inputs
from mmtrt.partition.placement import TENSORRT, Placement, Segment

SUFFIX = ".segment.onnx"
POINTS = ("min", "opt", "max")
FLOAT_NAMES = {TensorProto.FLOAT: "fp32", TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16"}


def extract(placement: Placement, segment: Segment) -> onnx.ModelProto:
    """The segment as a model of its own: its nodes, the weights they read and typed boundary tensors."""
    graph = placement.model.graph
    nodes = [graph.node[i] for i in segment.nodes]
    read = {name for n in nodes for name in node_inputs(n)}
    weights = [t for t in graph.initializer if t.name in read]
    inside = ({o for n in nodes for o in n.output} | read) - set(segment.inputs) - set(segment.outputs)
    value_info = [v for v in graph.value_info if v.name in inside]
    called = {(n.domain, n.op_type) for n in nodes}  # plugin nodes' decompositions (fuse_plugins)
    return helper.make_model(
        helper.make_graph(nodes, f"{placement.component}_{segment.index}", [_typed(placement, n) for n in segment.inputs],
                          [_typed(placement, n) for n in segment.outputs], weights, value_info=value_info),
        opset_imports=placement.model.opset_import, ir_version=placement.model.ir_version,
        functions=[f for f in placement.model.functions if (f.domain, f.name) in called])


def _typed(placement: Placement, name: str) -> onnx.ValueInfoProto:
    shape = placement.facts.shapes.get(name)
    return helper.make_tensor_value_info(name, placement.facts.types.get(name, TensorProto.UNDEFINED), shape)


def write(placement: Placement, folder: Path, threshold: int, component_files: dict[str, Any] | None,
          stored: StoredTensors) -> list[dict[str, Any]]:
    """Write a file per segment when the component is split, or when the placement is of another form of its graph
    (`component_files` None), reading the tensors `stored` holds, and beside a TensorRT segment's file the form
    TensorRT's parser reads where it differs (`parser_form`); returns per segment its files (every one it reads)
    and their digest (over both forms)."""
    entries = []
    whole = len(placement.segments) == 1 and component_files is not None
    for s in placement.segments:
        if whole:
            files = list(component_files["files"])
        else:
            files = save_onnx(extract(placement, s), folder / f"{placement.segment_id(s)}{SUFFIX}", threshold, stored)
        entry = {"id": placement.segment_id(s), "backend": s.backend, "onnx": files[0], "files": files}
        form = write_form(folder, files[0]) if s.backend == TENSORRT else None
        if form:
            entry["tensorrt_onnx"] = form
        entry["sha256"] = files_digest(folder, files + ([form] if form else []))
        entries.append(entry)
    return entries


def files_digest(folder: Path, files: list[str]) -> str:
    """One digest for a model and its external data: what an engine built from it depends on."""
    h = hashlib.sha256()
    for name in files:
        h.update(f"{Path(name).name}:{sha256_file(folder / name)}\n".encode())
    return h.hexdigest()


def profile(placement: Placement, segment: Segment, dims: dict[str, dict[str, int]]) -> tuple[dict | None, str | None]:
    """min/opt/max per segment input from the shape plan; (None, why) when a dimension is not planned."""
    shapes = {}
    for name in segment.inputs:
        shape = placement.facts.shapes.get(name)
        if shape is None:
            return None, f"the shape of {name} is unknown"
        try:
            shapes[name] = {p: [dim_at(d, dims, p) for d in shape] for p in POINTS}
        except KeyError as exc:
            return None, f"{name} has dimension {exc.args[0]!r}, which the shape plan does not cover"
    return shapes, None


# Inputs TensorRT takes as shape tensors (their values set an output's shape), with the range of those values as
# expressions on planned dimensions: kv_layout's `logits_from` is a Slice start on the sequence axis, from 0 (every
# position's logits) to seq - 1 (the last one's). A profile gives TensorRT their values (`set_shape_input`).
SHAPE_VALUES = {"logits_from": ("0", "seq - 1")}


def shape_values(segment: Segment, dims: dict[str, dict[str, int]]) -> dict[str, dict[str, list[int]]]:
    """min/opt/max values of the segment's shape-tensor inputs."""
    return {name: {"min": [dim_at(low, dims, "min")], "opt": [dim_at(high, dims, "opt")],
                   "max": [dim_at(high, dims, "max")]}
            for name, (low, high) in SHAPE_VALUES.items() if name in segment.inputs}


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def dim_at(dim, dims: dict[str, dict[str, int]], point: str) -> int:
    """A fixed size, a planned dimension, or arithmetic on planned dimensions (the exporter writes `past + seq`)."""
    if isinstance(dim, int):
        return dim
    if dim is None:
        raise KeyError("?")
    if dim in dims:
        return dims[dim][point]
    try:
        return _evaluate(ast.parse(dim, mode="eval").body, dims, point)
    except (SyntaxError, KeyError):
        raise KeyError(dim) from None


def _evaluate(expr, dims, point) -> int:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, int):
        return expr.value
    if isinstance(expr, ast.Name):
        return dims[expr.id][point]
    if isinstance(expr, ast.BinOp) and type(expr.op) in _OPS:
        return _OPS[type(expr.op)](_evaluate(expr.left, dims, point), _evaluate(expr.right, dims, point))
    raise KeyError(ast.unparse(expr))


def precision(placement: Placement, segment: Segment) -> dict[str, Any]:
    """The float types the segment's nodes produce: `fp16` when any node computes in fp16, and the counts."""
    graph = placement.model.graph
    counts = Counter(FLOAT_NAMES[placement.facts.types[o]] for i in segment.nodes for o in graph.node[i].output
                     if placement.facts.types.get(o) in FLOAT_NAMES)
    reduced = [t for t in ("fp16", "bf16") if counts[t]]
    return {"dtype": reduced[0] if reduced else "fp32", "float_outputs": dict(sorted(counts.items()))}
