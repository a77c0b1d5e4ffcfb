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


def _key(data_type: int, dims, raw: bytes) -> tuple:
    return data_type, tuple(dims), hashlib.sha256(raw).digest()


def _transposed(raw: bytes, data_type: int, dims) -> bytes | None:
    """The bytes of the 2-D tensor `raw` transposed; None where elements are not whole bytes (int4)."""
    itemsize = helper.tensor_dtype_to_np_dtype(data_type).itemsize
    if len(raw) != itemsize * dims[0] * dims[1]:
        return None
    return np.frombuffer(raw, dtype=f"V{itemsize}").reshape(dims).T.tobytes()


class StoredTensors:
    """The external tensors saved so far into one folder: digest -> where their bytes lie."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.saved: dict[tuple, list[onnx.StringStringEntryProto]] = {}
        self.tables: dict[tuple, tuple[list[onnx.StringStringEntryProto], list[int]]] = {}

    def add(self, tensor: onnx.TensorProto, raw: bytes, table: bool) -> None:
        """Record `tensor`, just saved with its bytes `raw`; a `table` (the token embedding) is also found by its
        transpose."""
        entries = list(tensor.external_data)
        self.saved.setdefault(_key(tensor.data_type, tensor.dims, raw), entries)
        flipped = _transposed(raw, tensor.data_type, tensor.dims) if table and len(tensor.dims) == 2 else None
        if flipped is not None:
            self.tables.setdefault(_key(tensor.data_type, tensor.dims[::-1], flipped), (entries, list(tensor.dims)))

    def same(self, tensor: onnx.TensorProto, raw: bytes) -> list[onnx.StringStringEntryProto] | None:
        """The external data entries of a saved tensor with `tensor`'s dtype, dims and bytes, or None."""
        entries = self.saved.get(_key(tensor.data_type, tensor.dims, raw))
        return entries if entries is not None and self._read(entries) == raw else None

    def transposed(self, tensor: onnx.TensorProto, raw: bytes):
        """(entries, dims) of a saved table whose transpose is `tensor`, or None."""
        found = self.tables.get(_key(tensor.data_type, tensor.dims, raw))
        if found is None:
            return None
        entries, dims = found
        return found if _transposed(self._read(entries), tensor.data_type, dims) == raw else None

    def _read(self, entries) -> bytes:
        where = {e.key: e.value for e in entries}
        with open(self.folder / where["location"], "rb") as f:
            f.seek(int(where["offset"]))
            return f.read(int(where["length"]))


def transpose_node(table: str, output: str) -> onnx.NodeProto:
    return helper.make_node("Transpose", [table], [output], name=f"{output}/tied_transpose", perm=[1, 0])


def fresh_name(base: str, taken: set[str]) -> str:
    name, i = base, 1
    while name in taken:
        name, i = f"{base}.{i}", i + 1
    return name
