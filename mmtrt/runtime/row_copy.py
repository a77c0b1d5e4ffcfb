"""Row copies of the static KV cache where ONNX Runtime owns the buffers (onnxruntime-gpu: CUDA memory, which numpy
cannot address). Three small ONNX Runtime sessions on the cache's own provider, bound by address through IOBinding
as the LLM session is, do the copies on the device: a whole row into another row (Identity), host rows padded into
a row (Pad from a CPU input), and a row's first positions out to host memory (Slice to a CPU output).

A row copy moves every position, where the host path moves the first `tokens`: what lies past a row's length is
never read (the scheduler's lengths bound every step), so the two paths hold the same rows up to their lengths.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


def _model(node: onnx.NodeProto, inputs: list[onnx.ValueInfoProto], dtype) -> bytes:
    out = helper.make_tensor_value_info("y", ONNX_TYPES[np.dtype(dtype)], None)
    graph = helper.make_graph([node], "row_copy", inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10).SerializeToString()


class RowCopier:
    """Copies between rows of [rows, H_kv, capacity, D] buffers at device addresses, and to and from the host."""

    def __init__(self, device: str, dtype, providers: list[str], row_shape: tuple[int, int, int]):
        self.device, self.dtype, self.row_shape = device, dtype, row_shape
        t = ONNX_TYPES[np.dtype(dtype)]
        x = helper.make_tensor_value_info("x", t, [None, None, None])
        index = helper.make_tensor_value_info("i", TensorProto.INT64, [None])
        options = ort.SessionOptions()
        options.log_severity_level = 3
        make = lambda node, inputs: ort.InferenceSession(_model(node, inputs, dtype), options, providers=providers)
        self.copy = make(helper.make_node("Identity", ["x"], ["y"]), [x])
        self.pad = make(helper.make_node("Pad", ["x", "i"], ["y"]), [x, index])
        self.head = make(helper.make_node("Slice", ["x", "i", "i_end", "i_axis"], ["y"]),
                         [x, index, helper.make_tensor_value_info("i_end", TensorProto.INT64, [1]),
                          helper.make_tensor_value_info("i_axis", TensorProto.INT64, [1])])

    def row_to_row(self, src: int, dst: int) -> None:
        io = self.copy.io_binding()
        io.bind_input("x", self.device, 0, self.dtype, self.row_shape, src)
        io.bind_output("y", self.device, 0, self.dtype, self.row_shape, dst)
        self.copy.run_with_iobinding(io)

    def host_to_row(self, rows: np.ndarray, dst: int) -> None:
        """rows [H_kv, n, D] into the first n positions of the row at `dst` (the rest zeros)."""
        io = self.pad.io_binding()
        io.bind_cpu_input("x", np.ascontiguousarray(rows, self.dtype))
        io.bind_cpu_input("i", np.array([0, 0, 0, 0, self.row_shape[1] - rows.shape[1], 0], np.int64))
        io.bind_output("y", self.device, 0, self.dtype, self.row_shape, dst)
        self.pad.run_with_iobinding(io)

    def row_to_host(self, src: int, tokens: int) -> np.ndarray:
        """The first `tokens` positions of the row at `src`, [H_kv, tokens, D], in host memory."""
        io = self.head.io_binding()
        io.bind_input("x", self.device, 0, self.dtype, self.row_shape, src)
        for name, value in (("i", 0), ("i_end", tokens), ("i_axis", 1)):
            io.bind_cpu_input(name, np.array([value], np.int64))
        io.bind_output("y", "cpu")
        self.head.run_with_iobinding(io)
        return io.copy_outputs_to_cpu()[0]
