"""KV cache managers: where the LLM's cache lives between calls, per layout the bundle's `kv_layout` pass chose.

`static`: one buffer per layer and kind `[rows, H_kv, capacity, D]`, allocated once per load on the device the LLM
session runs on (ONNX Runtime's CUDA EP on a GPU host, host memory otherwise) and bound through IOBinding as both
`past` and `present`, so the graph writes the new rows in place and no cache tensor is allocated or copied per
step. A sequence owns one row; a call binds a run of consecutive rows by address. `lengths[r]` counts the tokens
row r holds, `deltas[r]` is what its decode positions add to that (M-RoPE's rope delta). Row copies (an
out-of-order finish, an image prefix saved or loaded) go through numpy where numpy owns the buffers, and through
ONNX Runtime on the buffers' device otherwise (row_copy.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort

from mmtrt.errors import UserError

DTYPES = {"float32": np.float32, "float16": np.float16}


def cache_dtype(kv: dict[str, Any]) -> type:
    """The numpy type of the bundle's cache buffers; a bf16 cache (kv_layout after a bf16 cast_precision) is
    refused: numpy and ONNX Runtime's CPU kernels have no bfloat16."""
    if kv["dtype"] not in DTYPES:
        raise UserError(f"this bundle's KV cache is {kv['dtype']}; the runtime holds float32 and float16 caches; "
                        "recompile with cast_precision dtype fp16")
    return DTYPES[kv["dtype"]]


class StaticCache:
    """The shared buffers of one loaded bundle; rows are handed to sequences by the scheduler."""

    def __init__(self, kv: dict[str, Any], llm: dict[str, Any], rows: int, capacity: int, device: str = "cpu",
                 providers: list[str] | None = None):
        """`providers`: ONNX Runtime's for the buffers' device, which then owns them (needed off the CPU)."""
        self.rows, self.capacity = rows, capacity
        self.dtype = cache_dtype(kv)
        self.row_shape = (llm["num_kv_heads"], capacity, llm["head_dim"])
        self.names = [(kv["past"].format(layer=i, kind=k), kv["present"].format(layer=i, kind=k))
                      for i in range(llm["num_layers"]) for k in kv["kinds"]]
        self.device = device
        shape = (rows, *self.row_shape)
        self.row_bytes = int(np.prod(self.row_shape)) * np.dtype(self.dtype).itemsize
        self.copier = None
        if providers is None and device == "cpu":  # numpy owns the memory and ONNX Runtime reads and writes it in place
            self.host = {past: np.zeros(shape, self.dtype) for past, _ in self.names}
            self.ptrs = {past: a.ctypes.data for past, a in self.host.items()}
        else:  # builds its copy graphs with onnx: imported only where ONNX Runtime owns the buffers
            from mmtrt.runtime.row_copy import RowCopier

            self.values = {past: ort.OrtValue.ortvalue_from_shape_and_type(shape, self.dtype, device, 0)
                           for past, _ in self.names}
            self.ptrs = {past: v.data_ptr() for past, v in self.values.items()}
            self.copier = RowCopier(device, self.dtype, providers, self.row_shape)
            for past in self.ptrs:  # the device's memory starts undefined; the host path's starts at zero
                for row in range(rows):
                    self.copier.host_to_row(np.zeros((self.row_shape[0], 0, self.row_shape[2]), self.dtype),
                                            self._row(past, row))
        self.lengths = np.zeros(rows, np.int64)
        self.deltas = np.zeros(rows, np.int64)  # each row's M-RoPE rope delta (0 otherwise)

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.rows * len(self.names)

    def _row(self, past: str, row: int) -> int:
        return self.ptrs[past] + row * self.row_bytes

    def bind(self, io: ort.IOBinding, start: int, count: int) -> None:
        """Bind rows start..start+count as both past and present of every layer."""
        shape = (count, *self.row_shape)
        for past, present in self.names:
            ptr = self._row(past, start)
            io.bind_input(past, self.device, 0, self.dtype, shape, ptr)
            io.bind_output(present, self.device, 0, self.dtype, shape, ptr)

    def copy_row(self, src: int, dst: int, tokens: int | None = None) -> None:
        """Row dst takes row src's first `tokens` positions (all it holds by default)."""
        tokens = int(self.lengths[src]) if tokens is None else tokens
        for past, _ in self.names:
            if self.copier is None:
                self.host[past][dst, :, :tokens] = self.host[past][src, :, :tokens]
            else:
                self.copier.row_to_row(self._row(past, src), self._row(past, dst))
        self.lengths[dst] = tokens
        self.deltas[dst] = self.deltas[src]

    def load_row(self, row: int, prefix: list[np.ndarray]) -> None:
        """Write a stored prefix (one [H_kv, n, D] array per buffer) into the start of `row`."""
        for (past, _), rows in zip(self.names, prefix):
            if self.copier is None:
                self.host[past][row, :, :rows.shape[1]] = rows
            else:
                self.copier.host_to_row(rows, self._row(past, row))
        self.lengths[row] = prefix[0].shape[1]

    def save_row(self, row: int, tokens: int) -> list[np.ndarray]:
        if self.copier is None:
            return [self.host[past][row, :, :tokens].copy() for past, _ in self.names]
        return [self.copier.row_to_host(self._row(past, row), tokens) for past, _ in self.names]


def cache_providers(providers: list[str]) -> list[str] | None:
    """ONNX Runtime's providers for buffers it owns (the LLM session's, on a GPU), None where numpy owns them."""
    return providers if cache_device(providers) != "cpu" else None


def cache_device(providers: list[str]) -> str:
    """Where the buffers go: the device of the LLM session's first provider."""
    return "cuda" if providers and providers[0] == "CUDAExecutionProvider" else "cpu"
