"""Weights that stay in the source model until the bundle is written, so compile memory follows the checkpoint.

Holding every exported graph's float32 weights at once made a lossless compile's memory 4x the checkpoint's
bytes. While `kept()` is active, the export traces each large parameter as a float32 placeholder that takes no
memory (an allocation nobody writes), and each initializer of the exported graph that reads a placeholder (the
parameter itself, or the transpose of it the exporter folds) becomes a reference to its source tensor, in the
checkpoint's own dtype, and to the view the exporter took of it. The reference is an external data entry whose
location names no file: the bundle writer widens the source a block at a time as it saves (`tensor_data`),
and a pass that edits a graph takes its weights into memory first (`materialize`). The bytes are the float32
export's to the bit, since every bfloat16 and float16 value is exactly a float32. A checkpoint's safetensors
are mapped, and a page read stays resident until the kernel needs it back: once a view is widened, its source's
pages are handed back (`release`), so writing a bundle holds one tensor of the checkpoint at a time, not all of it.
"""

from __future__ import annotations

import contextlib
import itertools
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import torch
from onnxscript.optimizer._constant_folding import DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT

from mmtrt.ir.resident import release

LOCATION = "mmtrt:source-model"
# a parameter the exporter may fold with anything is exported with its real values; larger ones only meet the
# folder's always-fold Transpose, which a view of the placeholder records exactly
SMALL = DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT
BLOCK = 64 << 20  # bytes of a weight widened, hashed or compared at a time: none is held whole twice


@dataclass(frozen=True)
class _View:
    source: torch.Tensor  # the parameter's tensor in the checkpoint's dtype, on the CPU
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements, into the source laid out contiguously
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * 4

    def array(self, *, rows: slice | None = None, columns: slice | None = None) -> np.ndarray:
        """The view's float32 values (of its first axis's `rows`, a 2-D view's `columns`, alone), in one new array
        (the source is widened into it)."""
        shape, offset = list(self.shape), self.offset
        for axis, part in ((0, rows), (1, columns)):
            if part is not None:
                start, stop, _ = part.indices(shape[axis])
                shape[axis], offset = max(0, stop - start), offset + start * self.strides[axis]
        out = torch.empty(shape, dtype=torch.float32)
        out.copy_(self.source.contiguous().as_strided(shape, self.strides, offset))
        release(self.source)
        return out.numpy()


@dataclass(frozen=True)
class _Joined:
    """2-D views side by side along their columns (a fused linear's weight), widened part by part."""
    parts: tuple[_View, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return self.parts[0].shape[0], sum(p.shape[1] for p in self.parts)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * 4

    def array(self, *, rows: slice | None = None, columns: slice | None = None) -> np.ndarray:
        start, stop, _ = (columns or slice(None)).indices(self.shape[1])
        pieces, at = [], 0
        for part in self.parts:
            low, high = max(start, at), min(stop, at + part.shape[1])
            if low < high:
                pieces.append(part.array(rows=rows, columns=slice(low - at, high - at)))
            at += part.shape[1]
        height = len(range(*(rows or slice(None)).indices(self.shape[0])))
        return np.concatenate(pieces, axis=1) if pieces else np.empty((height, 0), np.float32)


@dataclass(frozen=True)
class Widening:
    """A reference's bytes, widened from its source (or read from the compile's scratch file, mmtrt/ir/spill.py) a
    block at a time: no one holds a large weight's float32 copy whole while saving, hashing or comparing it."""
    view: Any  # _View, _Joined, or any view with shape, nbytes and array(rows=, columns=)

    def __len__(self) -> int:
        return self.view.nbytes

    def blocks(self, size: int):
        """The bytes in order, whole rows of the first axis at a time, about `size` bytes each."""
        if not self.view.shape or len(self) == 0:
            yield memoryview(self.view.array()).cast("B")
            return
        rows = self.view.shape[0]
        step = max(1, size * rows // len(self))
        for r in range(0, rows, step):
            yield memoryview(self.view.array(rows=slice(r, r + step))).cast("B")

    def columns(self, columns: slice) -> np.ndarray:
        return self.view.array(columns=columns)


def pieces(data: bytes | memoryview | Widening):
    """The bytes of `data` (as `tensor_data` gives them) in order, about BLOCK at a time."""
    size = BLOCK
    if isinstance(data, Widening):
        yield from data.blocks(size)
        return
    view = memoryview(data).cast("B")
    for at in range(0, len(view), size):
        yield view[at:at + size]


class _Registry:
    def __init__(self):
        self.placeholders: dict[int, tuple[int, torch.Tensor, torch.Tensor]] = {}  # start -> (end, held, source)
        self.views: dict[str, _View | _Joined] = {}
        self.keys = itertools.count()

    def placeholder(self, source: torch.Tensor) -> torch.Tensor:
        held = torch.empty(source.shape, dtype=torch.float32)
        start = held.data_ptr()
        self.placeholders[start] = (start + held.numel() * 4, held, source.detach().cpu())
        return held

    def view_of(self, array: np.ndarray) -> _View | None:
        """The view of a source that `array` (a float32 array over a placeholder's memory) is, or None."""
        if array.dtype != np.float32 or array.size == 0:
            return None
        address = array.__array_interface__["data"][0]
        for start, (end, _, source) in self.placeholders.items():
            if start <= address < end:
                return _View(source, tuple(array.shape), tuple(s // 4 for s in array.strides), (address - start) // 4)
        return None


_registry: ContextVar[_Registry | None] = ContextVar("source_weights", default=None)


@contextlib.contextmanager
def kept():
    """For the duration, exports leave large weights in the source model and graphs refer to them."""
    token = _registry.set(_Registry())
    try:
        yield
    finally:
        _registry.reset(token)


def active() -> bool:
    return _registry.get() is not None


def placeholder(source: torch.Tensor) -> torch.Tensor | None:
    """A float32 stand-in for a large floating parameter while `kept()` is active, else None."""
    registry = _registry.get()
    if registry is None or not source.is_floating_point() or source.numel() <= SMALL:
        return None
    return registry.placeholder(source)


def refer(model: ir.Model) -> None:
    """Every initializer of an exported `model` that views a placeholder becomes a reference to its source."""
    registry = _registry.get()
    if registry is None:
        return
    for value in model.graph.initializers.values():
        tensor = value.const_value
        raw = getattr(tensor, "raw", None)
        array = raw.detach().numpy() if isinstance(raw, torch.Tensor) and raw.device.type == "cpu" else raw
        view = registry.view_of(array) if isinstance(array, np.ndarray) else None
        if view is None:
            continue
        key = f"{LOCATION}/{next(registry.keys)}"
        registry.views[key] = view
        value.const_value = ir.ExternalTensor(key, 0, array.size * 4, ir.DataType.FLOAT, shape=ir.Shape(view.shape),
                                              name=value.name)
    registry.placeholders.clear()  # the views hold their sources; the placeholders' memory goes back


def refer_to(tensor: onnx.TensorProto, view) -> None:
    """Make `tensor` a reference to `view` (shape, nbytes and array(rows=, columns=)), its own bytes dropped: a
    view of its dtype and dims, or of a packed tensor's bytes as one axis of uint8."""
    registry = _registry.get()
    key = f"{LOCATION}/{next(registry.keys)}"
    registry.views[key] = view
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for entry, value in (("location", key), ("offset", 0), ("length", view.nbytes)):
        tensor.external_data.add(key=entry, value=str(value))


def reference_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes a reference stands for (0 for a tensor that is none)."""
    key = _key(tensor)
    return _registry.get().views[key].nbytes if key else 0


def _key(tensor: onnx.TensorProto) -> str | None:
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    location = next((e.value for e in tensor.external_data if e.key == "location"), "")
    return location if location.startswith(f"{LOCATION}/") else None


def is_reference(tensor: onnx.TensorProto) -> bool:
    return _key(tensor) is not None


def tensor_data(tensor: onnx.TensorProto) -> bytes | Widening | None:
    """The raw bytes of `tensor`: its own, or its source's as a Widening; None for a tensor in another form."""
    key = _key(tensor)
    if key is None:
        return tensor.raw_data if tensor.HasField("raw_data") else None
    registry = _registry.get()
    if registry is None or key not in registry.views:
        raise RuntimeError(f"initializer {tensor.name} refers to a source model that is no longer held")
    return Widening(registry.views[key])


def tensor_bytes(tensor: onnx.TensorProto) -> bytes | memoryview | None:
    """The raw bytes of `tensor`: its own, or its source's widened (a view of one new array); None for a tensor
    in another form."""
    data = tensor_data(tensor)
    return memoryview(data.view.array()).cast("B") if isinstance(data, Widening) else data


def materialize(model: onnx.ModelProto) -> None:
    """Take every referenced weight of `model` into the graph, for a pass that reads or edits it."""
    for tensor in model.graph.initializer:
        if is_reference(tensor):
            materialize_one(tensor, tensor_bytes(tensor))


def held(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """`tensor`, or for a reference a copy holding its values (`tensor` is left as it was)."""
    if not is_reference(tensor):
        return tensor
    out = onnx.TensorProto()
    out.CopyFrom(tensor)
    materialize_one(out, tensor_bytes(tensor))
    return out


def materialize_one(tensor: onnx.TensorProto, raw) -> None:
    del tensor.external_data[:]
    tensor.ClearField("data_location")  # as a tensor that always held its bytes: its serialization the same
    tensor.raw_data = bytes(raw)


def transposed(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """A 2-D initializer transposed, a reference staying a reference."""
    key = _key(tensor)
    registry = _registry.get()
    view = registry.views[key] if key else None
    if not isinstance(view, _View):
        return onnx.numpy_helper.from_array(array(tensor).T.copy(), tensor.name)
    flipped = _View(view.source, view.shape[::-1], view.strides[::-1], view.offset)
    out = onnx.TensorProto()
    out.CopyFrom(tensor)
    out.dims[:] = flipped.shape
    del out.external_data[:]
    refer_to(out, flipped)
    return out


def joined(tensors: list[onnx.TensorProto], name: str) -> onnx.TensorProto:
    """2-D initializers side by side, `np.concatenate(axis=1)` of them: a reference to their sources where each
    is one (nothing is widened until the bundle is written), else an initializer holding the values."""
    keys = [_key(t) for t in tensors]
    registry = _registry.get()
    parts = [registry.views[k] for k in keys] if registry is not None and None not in keys else [None]
    if not all(isinstance(p, (_View, _Joined)) for p in parts):
        return onnx.numpy_helper.from_array(np.concatenate([array(t) for t in tensors], axis=1), name)
    join = _Joined(tuple(v for part in parts for v in (part.parts if isinstance(part, _Joined) else (part,))))
    out = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=join.shape)
    refer_to(out, join)
    return out


def array(tensor: onnx.TensorProto, columns: slice | None = None) -> np.ndarray:
    """`numpy_helper.to_array` (of a 2-D initializer's `columns` alone), for an initializer that may refer to its
    source: a reference widens only those columns."""
    registry = _registry.get()
    view = registry.views[_key(tensor)] if is_reference(tensor) and registry else None
    if view is not None and tuple(view.shape) == tuple(tensor.dims):
        return view.array(columns=columns)
    whole = onnx.numpy_helper.to_array(held(tensor))  # a packed tensor's view holds its bytes, not its values
    return whole if columns is None else whole[:, columns]
