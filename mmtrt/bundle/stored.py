"""Each tensor's bytes once in a bundle: an initializer byte-identical to one already saved (same dtype, dims and
bytes) reads that one's external data, whichever component saved it; a segment file reads its component's. A tied
lm_head is the token table transposed ([hidden, vocab] where the embed graph gathers from [vocab, hidden]); it
reads the table's bytes through a Transpose, which ONNX Runtime and TensorRT fold into a constant when the session
or engine is built.

Equality is checked on the bytes themselves (a digest finds the candidate, the saved bytes are read back and
compared), never assumed from names or configs: a table a pass changed (quantized, pruned) is saved again. A table's
transpose is found by its dtype and dims, then compared block by block: a digest of the transpose would read the
whole table strided once more (0.7 GB above the writer's own memory for a 152k vocabulary) for bundles that mostly
have no tensor of those dims."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from mmtrt.ir import source_weights


def digest(raw) -> bytes:
    """The digest of a tensor's bytes (as `source_weights.tensor_data` gives them), read a block at a time."""
    return _digest(source_weights.pieces(raw))


def _digest(parts) -> bytes:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.digest()


def _columns(raw, data_type: int, dims):
    """columns(start, stop) of the 2-D tensor `raw`, as an array of opaque elements; None where the tensor is not
    2-D or its elements are not whole bytes (int4)."""
    itemsize = _itemsize(data_type)
    if len(dims) != 2 or len(raw) != itemsize * dims[0] * dims[1]:
        return None
    if isinstance(raw, source_weights.Widening):
        return lambda start, stop: raw.columns(slice(start, stop)).view(f"V{itemsize}")
    table = np.frombuffer(raw, dtype=f"V{itemsize}").reshape(dims)
    return lambda start, stop: table[:, start:stop]


def _itemsize(data_type: int) -> int:
    return helper.tensor_dtype_to_np_dtype(data_type).itemsize


class StoredTensors:
    """The external tensors saved so far into one folder: digest -> where their bytes lie."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.saved: dict[tuple, list[onnx.StringStringEntryProto]] = {}
        self.tables: dict[tuple, tuple[list[onnx.StringStringEntryProto], list[int]]] = {}

    def add(self, tensor: onnx.TensorProto, raw, sha: bytes, table: bool) -> None:
        """Record `tensor`, just saved with its bytes `raw` of `digest` sha; a 2-D `table` (the token embedding) is
        also found by its transpose."""
        entries = list(tensor.external_data)
        self.saved.setdefault((tensor.data_type, tuple(tensor.dims), sha), entries)
        if table and _columns(raw, tensor.data_type, tensor.dims) is not None:
            self.tables.setdefault((tensor.data_type, tuple(tensor.dims[::-1])), (entries, list(tensor.dims)))

    def same(self, tensor: onnx.TensorProto, raw, sha: bytes) -> list[onnx.StringStringEntryProto] | None:
        """The external data entries of a saved tensor with `tensor`'s dtype, dims and bytes, or None."""
        entries = self.saved.get((tensor.data_type, tuple(tensor.dims), sha))
        return entries if entries is not None and self._equal(entries, raw) else None

    def transposed(self, tensor: onnx.TensorProto, raw):
        """(entries, dims) of a saved table whose transpose is `tensor`, or None."""
        found = self.tables.get((tensor.data_type, tuple(tensor.dims)))
        columns = _columns(raw, tensor.data_type, tensor.dims) if found is not None else None
        if columns is None:
            return None
        entries, dims = found
        itemsize = _itemsize(tensor.data_type)
        rows = max(1, source_weights.BLOCK // max(1, itemsize * dims[1]))
        for r, block in enumerate(self._blocks(entries, rows * itemsize * dims[1])):
            saved = np.frombuffer(block, dtype=f"V{itemsize}").reshape(-1, dims[1])
            if not np.array_equal(saved.T, columns(r * rows, r * rows + len(saved))):
                return None
        return found

    def _equal(self, entries, raw) -> bool:
        """Whether the saved bytes of `entries` are `raw`'s, read back a piece of `raw` at a time."""
        where = {e.key: e.value for e in entries}
        if int(where["length"]) != len(raw):
            return False
        with open(self.folder / where["location"], "rb") as f:
            f.seek(int(where["offset"]))
            return all(f.read(len(piece)) == piece for piece in source_weights.pieces(raw))

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
