"""Exact integer GEMMs from ONNX Runtime on every x86 host.

Its CPU GEMM of uint8 activations and int8 weights (MatMulInteger, MatMulIntegerToFloat, DynamicQuantizeMatMul)
runs on VNNI's vpdpbusd where the processor has it, and sums every product exactly. Without VNNI (AVX2, and
AVX-512 without VNNI) it runs on vpmaddubsw, which adds each two neighbouring products in 16 bits and saturates
there: two activations near the top of their range against two weights near theirs make 2 x 255 x 127 > 32,767,
and the output is wrong by up to that much. ONNX Runtime's session entry `session.x64quantprecision` turns the
int8 weights into uint8 ones when the session is made, so the GEMM runs as uint8 x uint8 (16-bit operands,
32-bit sums: exact) at some cost in speed; on a VNNI host it would only cost speed. So every session mmtrt makes
on a graph with such a GEMM sets it where a probe of this host's GEMM finds the saturation, and a bundle's int8
linears compute the same products wherever it is deployed. Only on such graphs: the entry also rewrites int8
weights that a per-channel DequantizeLinear reads without a zero point (`int8_weights` with float activations)
into uint8 with a scalar zero point 128, which that DequantizeLinear refuses at run time (ONNX Runtime 1.31)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

EXACT_PRODUCTS = "session.x64quantprecision"
INTEGER_GEMMS = frozenset({"MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearMatMul", "QGemm"})
PROBE_K = 64


def integer_product(a: np.ndarray, b: np.ndarray, exact: bool = False) -> np.ndarray:
    """sum((a - 128) * b) of uint8 `a` [M, K] and int8 `b` [K, N] as this host's ONNX Runtime computes it (int32),
    in a session with the exact products entry set where this host needs it (`exact`) or not."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if exact:
        exact_products(options, ["MatMulInteger"])
    session = ort.InferenceSession(probe_model(a.shape, b), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"a": a})[0]


def probe_model(a_shape: tuple[int, int], b: np.ndarray) -> bytes:
    """The serialized ONNX model y = MatMulInteger(a, b, 128) (opset 17) of a uint8 input `a` of `a_shape` and the
    int8 initializer `b`, written in the protobuf wire format: the light runtime probes its host without `onnx`."""
    def tensor(name: str, elem: int, dims: tuple[int, ...], raw: bytes) -> bytes:
        return b"".join(_number(1, d) for d in dims) + _number(2, elem) + _bytes(8, name) + _bytes(9, raw)

    def value(name: str, elem: int, dims: tuple[int, ...]) -> bytes:
        shape = b"".join(_bytes(1, _number(1, d)) for d in dims)
        return _bytes(1, name) + _bytes(2, _bytes(1, _number(1, elem) + _bytes(2, shape)))

    uint8, int8, int32 = 2, 3, 6  # TensorProto.DataType
    node = b"".join(_bytes(1, n) for n in ("a", "b", "zero")) + _bytes(2, "y") + _bytes(4, "MatMulInteger")
    graph = (_bytes(1, node) + _bytes(2, "int8_gemm_probe")
             + _bytes(5, tensor("b", int8, b.shape, np.ascontiguousarray(b, np.int8).tobytes()))
             + _bytes(5, tensor("zero", uint8, (), bytes([128])))
             + _bytes(11, value("a", uint8, tuple(a_shape))) + _bytes(12, value("y", int32, (a_shape[0], b.shape[1]))))
    return _number(1, 9) + _bytes(7, graph) + _bytes(8, _bytes(1, "") + _number(2, 17))


def _bytes(field: int, payload: bytes | str) -> bytes:
    payload = payload.encode() if isinstance(payload, str) else payload
    return _encode_varint(field << 3 | 2) + _encode_varint(len(payload)) + payload


def _number(field: int, value: int) -> bytes:
    return _encode_varint(field << 3) + _encode_varint(value)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.cache
def saturates() -> bool:
    """Whether this host's uint8 x int8 GEMM saturates pairs of products (probed on a product that does)."""
    y = integer_product(np.full((4, PROBE_K), 255, np.uint8), np.full((PROBE_K, 16), 127, np.int8))
    return not np.array_equal(y, np.full_like(y, 127 * 127 * PROBE_K))


def exact_products(options, ops: Iterable[str]) -> None:
    """Set ONNX Runtime's uint8 x uint8 GEMM on `options` (an `ort.SessionOptions`) for a graph of `ops` (its nodes'
    op types) with a uint8 x int8 GEMM, where this host's saturates."""
    if INTEGER_GEMMS.intersection(ops) and saturates():
        options.add_session_config_entry(EXACT_PRODUCTS, "1")


def graph_ops(path: Path) -> set[str]:
    """The op types of the nodes of the ONNX graph at `path`, read from the protobuf wire format (ModelProto.graph,
    GraphProto.node, NodeProto.op_type) without the `onnx` package, which the light runtime does not import; empty
    for a file that is no ModelProto (ONNX Runtime says why when it loads it)."""
    data = memoryview(Path(path).read_bytes())
    return {bytes(op).decode("utf-8", "replace") for graph in _fields(data, 7) for node in _fields(graph, 1)
            for op in _fields(node, 4)}


def _fields(message: memoryview, wanted: int) -> list[memoryview]:
    """The payloads of `message`'s length-delimited fields numbered `wanted`; those read before a malformed byte."""
    found, at = [], 0
    try:
        while at < len(message):
            key, at = _varint(message, at)
            kind = key & 7
            if kind == 0:
                _, at = _varint(message, at)
                continue
            size = {1: 8, 5: 4}.get(kind)
            if kind == 2:
                size, at = _varint(message, at)
            if size is None or at + size > len(message):
                break
            if kind == 2 and key >> 3 == wanted:
                found.append(message[at:at + size])
            at += size
    except IndexError:
        pass
    return found


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def integer_linears(manifest: dict[str, Any]) -> list[str]:
    """The passes of a bundle that left uint8 x int8 GEMMs in its graphs, by the manifest's record of its passes
    (informational: a record in another form names none)."""
    records = manifest.get("passes")
    found = []
    for record in records if isinstance(records, list) else []:
        config = record.get("config") if isinstance(record, dict) else None
        name = record.get("pass") if isinstance(record, dict) else None
        if name == "int8_prefill" or (name == "int8_weights" and isinstance(config, dict)
                                      and config.get("activations", "float") != "float"):
            found.append(name)
    return found


def uint8_note(manifest: dict[str, Any]) -> str | None:
    """One line for a bundle whose int8 linears run as uint8 x uint8 GEMMs on this host, else None."""
    passes = integer_linears(manifest)
    if not passes or not saturates():
        return None
    return (f"this CPU has no VNNI: the bundle's {' and '.join(sorted(set(passes)))} linears run on ONNX Runtime's "
            "uint8 x uint8 GEMM, exact but slower than on a CPU with AVX-512 VNNI or AVX-VNNI "
            "(docs/results/ort-cpu-kernels.md)")
