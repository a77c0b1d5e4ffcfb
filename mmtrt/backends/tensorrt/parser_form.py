"""The file TensorRT's ONNX parser reads for a segment: the ONNX Runtime form plus what only onnx-tensorrt reads.

- `Attention` gets `TRT_decomposable = 1`: onnx-tensorrt's Attention importer passes it to
  `IAttention::setDecomposable`, which lets the builder run the attention as several kernels where no fused kernel
  covers it (every fp32 attention: "Attention operation was not supported by a dedicated kernel" otherwise); where
  a fused kernel exists it is still the one used.
- `Attention` loses `softmax_precision`: onnx-tensorrt's checker rejects the attribute ("Setting softmax precision
  is not supported in TensorRT Attention."). TensorRT's attention kernels keep the softmax in fp32 themselves; ONNX
  Runtime's CPU kernel gives identical results with or without it, so the ONNX Runtime form keeps it.

Neither is valid ONNX to the checker or to ONNX Runtime (an unknown attribute), hence a second file. It shares the
first one's external data file (same initializers at the same offsets, `onnx.load(load_external_data=False)`
keeps the references), so it costs the graph only.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper

SUFFIX = ".trt.onnx"
ONLY_ORT = ("softmax_precision",)


def tensorrt_form(model: onnx.ModelProto) -> bool:
    """Rewrite `model` in place into the parser's form; True when anything changed."""
    changed = False
    for node in model.graph.node:
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx"):
            continue
        for attribute in [a for a in node.attribute if a.name in ONLY_ORT]:
            node.attribute.remove(attribute)
        if not any(a.name == "TRT_decomposable" for a in node.attribute):
            node.attribute.append(helper.make_attribute("TRT_decomposable", 1))
        changed = True
    return changed


def write_form(folder: Path, onnx_file: str) -> str | None:
    """Write `<name>.trt.onnx` beside `onnx_file` (relative to `folder`) when the parser needs another form;
    returns its relative name, or None when the parser reads `onnx_file` as it is."""
    model = onnx.load(folder / onnx_file, load_external_data=False)
    if not tensorrt_form(model):
        return None
    rel = onnx_file[: -len(".onnx")] + SUFFIX
    onnx.save(model, folder / rel)
    return rel
