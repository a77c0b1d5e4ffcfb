"""Weights a compile has made and no later pass edits, moved out of memory until the bundle is written.

The passes that round weights (`awq_int4`, `int8_weights`, `int8_prefill`) make new tensors, held in the IR until
the bundle is written: with the CPU int4 recipe on LLaVA-OneVision-0.5B the int8 vision tower (0.41 GB), the INT4
LLM (0.38 GB) and its int8 prompt graph (0.36 GB) were all resident through `int8_prefill`'s calibration and the
writing, on top of what each step needs. Once the last pass that lists a component is done, its large initializers
go to a scratch file and become references (mmtrt/ir/source_weights.py), read back a block at a time by whoever
reads them: a calibration session's file, the bundle writer. During that last pass, the weights it makes go there
as they are made (`as_made`, `made`). Packed sub-byte tensors (INT4 DequantizeLinear weights) go as their bytes,
read back through `source_weights.held` for their values. The file has no name (O_TMPFILE where the system has
it, else unlinked once open) and lives beside the staging bundle, on the disk the user chose for it: it holds at
most the bundle's own bytes, and goes with the process however the compile ends.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from mmtrt.ir import resident, source_weights

MIN_BYTES = 1 << 20  # initializers smaller than this stay in memory (norms, biases, scales of a small layer)
PACKED_BITS = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4, onnx.TensorProto.FLOAT4E2M1: 4,
               onnx.TensorProto.INT2: 2, onnx.TensorProto.UINT2: 2}

_scratch: ContextVar[_Scratch | None] = ContextVar("spill_scratch", default=None)
_as_made: ContextVar[tuple[onnx.ModelProto, ...]] = ContextVar("spill_as_made", default=())


@dataclass(frozen=True)
class _Spilled:
    """A tensor's bytes in the scratch file, read back whole or by rows of its first axis (and columns of a 2-D
    one) into new, writable arrays."""

    fd: int
    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def array(self, *, rows: slice | None = None, columns: slice | None = None) -> np.ndarray:
        shape = list(self.shape)
        start = 0
        if rows is not None and shape:
            first, stop, _ = rows.indices(shape[0])
            row_bytes = self.nbytes // shape[0] if shape[0] else 0
            start, shape[0] = first * row_bytes, max(0, stop - first)
        buffer = bytearray(int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize)
        if buffer and os.preadv(self.fd, [buffer], self.offset + start) != len(buffer):
            raise OSError(f"the compile's scratch file ended before {len(buffer)} bytes at {self.offset + start}")
        out = np.frombuffer(buffer, self.dtype).reshape(shape)
        return out if columns is None else np.ascontiguousarray(out[:, columns])


class _Scratch:
    def __init__(self, folder: Path):
        self.file = tempfile.TemporaryFile(dir=folder)

    def write(self, raw: bytes) -> int:
        offset = self.file.seek(0, os.SEEK_END)
        self.file.write(raw)
        self.file.flush()
        return offset


@contextlib.contextmanager
def scratch(folder: Path):
    """For the duration, `spill` moves weights into a scratch file in `folder`."""
    held = _Scratch(Path(folder))
    token = _scratch.set(held)
    try:
        yield
    finally:
        _scratch.reset(token)
        held.file.close()


@contextlib.contextmanager
def as_made(models: list[onnx.ModelProto]):
    """For the duration (a pass after which no pass lists these graphs' components), `made` moves the weights made
    for these graphs to the scratch file before they join them: awq_int4's INT4 weights (0.1 GB a 7B layer, as
    MatMulNBits or as DequantizeLinear's packed int4) otherwise stay resident from the layer that rounds them to the
    end of the pass, int8_weights' int8 ones from their linear's rounding, and int8_prefill's int8 copy of the LLM
    until its whole prompt graph is made."""
    token = _as_made.set(tuple(models))
    try:
        yield
    finally:
        _as_made.reset(token)


def made(model: onnx.ModelProto, tensor: onnx.TensorProto) -> None:
    """Move `tensor`, a new weight about to join `model`'s graph, to the scratch file if `model` is under
    `as_made` and the tensor is large: it joins as a reference, and its bytes never enter the graph's arena."""
    held = _scratch.get()
    if held is not None and source_weights.active() and any(model is m for m in _as_made.get()):
        _move(held, tensor)


def spill(component) -> int:
    """Move the initializers of at least MIN_BYTES of `component`'s graph that hold their bytes in memory to the
    scratch file, as references to it; the bytes moved (none outside `scratch()` or `source_weights.kept()`). The
    component gets a fresh copy of its graph: protobuf's upb runtime keeps a cleared field's bytes in the message's
    arena until the whole message is gone, so clearing alone freed nothing."""
    held = _scratch.get()
    if held is None or not source_weights.active():
        return 0
    model = component.onnx
    moved = sum(_move(held, tensor) for tensor in model.graph.initializer)
    if moved:
        component.onnx = onnx.ModelProto()
        component.onnx.CopyFrom(model)
        del model
        resident.give_back_freed_memory()
    return moved


def _move(held: _Scratch, tensor: onnx.TensorProto) -> int:
    """The tensor's bytes written to the scratch file and the tensor made a reference to them; the bytes moved."""
    dtype = _dtype(tensor)
    if dtype is None:
        return 0
    raw = tensor.raw_data  # each read of the field is a copy of its bytes
    count = int(np.prod(tensor.dims, dtype=np.int64))
    if len(raw) < MIN_BYTES:
        return 0
    if len(raw) == count * dtype.itemsize:
        shape = tuple(tensor.dims)
    elif tensor.data_type in PACKED_BITS and len(raw) == -(-count * PACKED_BITS[tensor.data_type] // 8):
        dtype, shape = np.dtype(np.uint8), (len(raw),)  # several values a byte: kept as the tensor's bytes
    else:
        return 0
    offset = held.write(raw)
    source_weights.refer_to(tensor, _Spilled(held.file.fileno(), offset, dtype, shape))
    return len(raw)


def _dtype(tensor: onnx.TensorProto) -> np.dtype | None:
    if tensor.data_location == onnx.TensorProto.EXTERNAL or not tensor.HasField("raw_data"):
        return None
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError, ValueError):
        return None
    return dtype if dtype.kind == "f" or dtype.itemsize == 1 else None  # weights, not shapes or indices
