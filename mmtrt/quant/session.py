"""ONNX Runtime sessions on the IR's graphs for calibration, at any size.

A small graph's session is made from its serialized bytes. A graph above `IN_MEMORY_BYTES` is written to a
temporary folder instead, its large initializers as external data one at a time (no second copy in memory), and
the session loads it from there: protobuf caps serialized bytes at 2 GB (a float32 vision tower of 675M
parameters, Qwen2-VL-2B's, or a few layers of a 7B LLM are more), and below that a session made from bytes held
the bytes, protobuf's parse of them, its own tensors and ONNX Runtime's prepacked weights at once (1.6 GB for the
0.4 GB INT4 LLM of LLaVA-OneVision-0.5B, against 0.5 GB loaded from a file). So is a graph that refers to the
source model's weights (mmtrt/ir/source_weights.py): widened one at a time into the file, they are held once, by
the session, where a widened copy of the graph and its serialized bytes held them three times over while the
session was made. (Handing the arrays over with `SessionOptions.add_initializer` beside a shell fails ONNX
Runtime's checks of the shell's initializers, with or without an external location.)

Calibration sessions run without ONNX Runtime's CPU memory arena. A calibration stage runs a decoder layer on
one whole calibration sequence (at OneVision-0.5B's size, 14 heads' score matrices over 1,800 tokens), and the
arena kept what it had grown to: on a OneVision-0.5B-shaped checkpoint with 4 decoder layers, the layer-at-a-time
calibration held about 1 GB more between layers with it, and each stage peaked 0.8 GB above that; the bundle is
the same bytes either way."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from mmtrt.backends.onnxruntime_backend import session_options
from mmtrt.ir import source_weights
from mmtrt.progress import track

IN_MEMORY_BYTES = 2**26  # serialized bytes a session is made from at most; a larger graph loads from a file
EXTERNAL_BYTES = 2**20  # initializers at least this large go to the external data file
DATA = "weights.bin"


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    """A calibration session on the compile's device: ONNX Runtime's CUDA provider under `--device cuda` where
    this ONNX Runtime has it (its kernels round differently from the CPU's, so calibrated bundles differ in the
    last bits), else the CPU."""
    from mmtrt.ir.export import device

    cuda = device().type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers()
    providers = ["CUDAExecutionProvider"] * cuda + ["CPUExecutionProvider"]
    options = session_options(None, spin=False, ops={n.op_type for n in model.graph.node})
    options.enable_cpu_mem_arena = False
    if serialized_bytes(model) < IN_MEMORY_BYTES and not any(map(source_weights.is_reference, model.graph.initializer)):
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    with tempfile.TemporaryDirectory(prefix="mmtrt-session-") as tmp:
        return ort.InferenceSession(str(save_external(model, Path(tmp))), options, providers=providers)


def serialized_bytes(model: onnx.ModelProto) -> int:
    """The bytes of `model` serialized with its referenced weights taken in."""
    return model.ByteSize() + sum(map(source_weights.reference_bytes, model.graph.initializer))


def save_external(model: onnx.ModelProto, folder: Path) -> Path:
    """`model` as `folder`/model.onnx with its large initializers (and every referenced one) in one data file,
    written one at a time; `model` is left as it was."""
    initializers = []
    with open(folder / DATA, "wb") as data:
        for tensor in model.graph.initializer:
            raw = source_weights.tensor_data(tensor)
            if raw is None or (len(raw) < EXTERNAL_BYTES and not source_weights.is_reference(tensor)):
                initializers.append(tensor)
                continue
            out = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims,
                                   data_location=onnx.TensorProto.EXTERNAL)
            for key, value in (("location", DATA), ("offset", data.tell()), ("length", len(raw))):
                out.external_data.add(key=key, value=str(value))
            for piece in source_weights.pieces(raw):
                data.write(piece)
            initializers.append(out)
    g = model.graph
    graph = helper.make_graph(g.node, g.name, g.input, g.output, initializers, value_info=g.value_info)
    shell = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version,
                              functions=model.functions)
    path = folder / "model.onnx"
    path.write_bytes(shell.SerializeToString())
    return path


def run_with_outputs(model: onnx.ModelProto, names: list[str],
                     batches: list[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """Run `model` on each batch for the tensors `names` alone; yields them with the feeds."""
    graph_inputs = {v.name for v in model.graph.input}
    extra = [n for n in dict.fromkeys(names) if n not in graph_inputs]
    declared = [onnx.ValueInfoProto.FromString(o.SerializeToString()) for o in model.graph.output]
    del model.graph.output[:]  # only the captures: ONNX Runtime then drops the nodes they do not need (lm_head)
    model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in extra)
    try:
        sess = session(model)
    finally:
        del model.graph.output[:]
        model.graph.output.extend(declared)
    for feeds in track(batches, "calibration batches", total=len(batches)):
        yield {**feeds, **dict(zip(extra, sess.run(extra, feeds)))}
