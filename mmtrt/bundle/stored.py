"""Each tensor's bytes once in a bundle: an initializer byte-identical to one already saved (same dtype, dims and
bytes) reads that one's external data, whichever component saved it; a segment file reads its component's. A tied
lm_head is the token table transposed ([hidden, vocab] where the embed graph gathers from [vocab, hidden]); it
reads the table's bytes through a Transpose, which ONNX Runtime and TensorRT fold into a constant when the session
or engine is built.

Equality is checked on the bytes themselves (a digest finds the candidate, the saved bytes are read back and
compared), never assumed from names or configs: a table a pass changed (quantized, pruned) is saved again."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import helper


BLOCK = 64 << 20  # bytes compared or hashed at a time: no check holds a second copy of a large tensor


def _key(data_type: int, dims, raw) -> tuple:
    return data_type, tuple(dims), _digest(raw)


def _digest(parts) -> bytes:
    h = hashlib.sha256()
    for part in ([parts] if isinstance(parts, (bytes, memoryview)) else parts):
        h.update(part)
    return h.digest()


def _table(raw, data_type: int, dims) -> np.ndarray | None:
    """The 2-D tensor `raw` as an array of opaque elements; None where elements are not whole bytes (int4)."""
    itemsize = helper.tensor_dtype_to_np_dtype(data_type).itemsize
    if len(dims) != 2 or len(raw) != itemsize * dims[0] * dims[1]:
        return None
    return np.frombuffer(raw, dtype=f"V{itemsize}").reshape(dims)


def _transposed_blocks(table: np.ndarray):
    """The bytes of `table` transposed, in order, a block of its columns at a time."""
    step = max(1, BLOCK // max(1, table.shape[0] * table.itemsize))
    for c in range(0, table.shape[1], step):
        yield table[:, c:c + step].T.tobytes()


class StoredTensors:
    """The external tensors saved so far into one folder: digest -> where their bytes lie."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.saved: dict[tuple, list[onnx.StringStringEntryProto]] = {}
        self.tables: dict[tuple, tuple[list[onnx.StringStringEntryProto], list[int]]] = {}

    def add(self, tensor: onnx.TensorProto, raw, table: bool) -> None:
        """Record `tensor`, just saved with its bytes `raw`; a `table` (the token embedding) is also found by its
        transpose."""
        entries = list(tensor.external_data)
        self.saved.setdefault(_key(tensor.data_type, tensor.dims, raw), entries)
        grid = _table(raw, tensor.data_type, tensor.dims) if table else None
        if grid is not None:
            key = (tensor.data_type, tuple(tensor.dims[::-1]), _digest(_transposed_blocks(grid)))
            self.tables.setdefault(key, (entries, list(tensor.dims)))

    def same(self, tensor: onnx.TensorProto, raw) -> list[onnx.StringStringEntryProto] | None:
        """The external data entries of a saved tensor with `tensor`'s dtype, dims and bytes, or None."""
        entries = self.saved.get(_key(tensor.data_type, tensor.dims, raw))
        return entries if entries is not None and self._equal(entries, raw) else None

    def transposed(self, tensor: onnx.TensorProto, raw):
        """(entries, dims) of a saved table whose transpose is `tensor`, or None."""
        found = self.tables.get(_key(tensor.data_type, tensor.dims, raw))
        if found is None:
            return None
        entries, dims = found
        mine = _table(raw, tensor.data_type, tensor.dims)
        rows = max(1, BLOCK // max(1, mine.itemsize * dims[1]))
        for r, block in enumerate(self._blocks(entries, rows * mine.itemsize * dims[1])):
            saved = np.frombuffer(block, dtype=mine.dtype).reshape(-1, dims[1])
            if not np.array_equal(saved.T, mine[:, r * rows:r * rows + len(saved)]):
                return None
        return found

    def _equal(self, entries, raw) -> bool:
        view, at = memoryview(raw).cast("B"), 0
        for block in self._blocks(entries, BLOCK):
            if block != view[at:at + len(block)]:
                return False
            at += len(block)
        return at == len(view)

    def _blocks(self, entries, size: int):
        """The saved bytes of `entries`, `size` bytes at a time."""
        where = {e.key: e.value for e in entries}
        left = int(where["length"])
        with open(self.folder / where["location"], "rb") as f:
            f.seek(int(where["offset"]))
            while left > 0:
                block = f.read(min(size, left))
                left -= len(block)
                yield block


def transpose_node(table: str, output: str) -> onnx.NodeProto:
    return helper.make_node("Transpose", [table], [output], name=f"{output}/tied_transpose", perm=[1, 0])


def fresh_name(base: str, taken: set[str]) -> str:
    name, i = base, 1
    while name in taken:
        name, i = f"{base}.{i}", i + 1
    return name
