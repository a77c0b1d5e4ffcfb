"""Whether ONNX Runtime's integer GEMMs are exact on this host.

Its CPU GEMM of uint8 activations and int8 weights (MatMulInteger, MatMulIntegerToFloat, DynamicQuantizeMatMul)
runs on VNNI's vpdpbusd where the processor has it, and sums every product exactly. Without VNNI (AVX2, and
AVX-512 without VNNI) it runs on vpmaddubsw, which adds each two neighbouring products in 16 bits and saturates
there: two activations near the top of their range against two weights near theirs make 2 x 255 x 127 > 32,767,
and the output is wrong by up to that much (ONNX Runtime's quantization guide: "reduce_range" or U8U8 on such
hosts). A bundle's int8 linears are compiled once and run wherever it is deployed, so the runtime probes the host
once and says so where its products would saturate."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

PROBE_K = 64


def integer_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum((a - 128) * b) of uint8 `a` [M, K] and int8 `b` [K, N] as this host's ONNX Runtime computes it (int32)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b", "zero"], ["y"])], "int8_gemm_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a.shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [a.shape[0], b.shape[1]])],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(128, np.uint8), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"a": a})[0]


@functools.cache
def saturates() -> bool:
    """Whether this host's uint8 x int8 GEMM saturates pairs of products (probed on a product that does)."""
    y = integer_product(np.full((4, PROBE_K), 255, np.uint8), np.full((PROBE_K, 16), 127, np.int8))
    return not np.array_equal(y, np.full_like(y, 127 * 127 * PROBE_K))


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


def saturation_note(manifest: dict[str, Any]) -> str | None:
    """One line for a bundle whose int8 linears lose accuracy on this host, else None."""
    passes = integer_linears(manifest)
    if not passes or not saturates():
        return None
    return (f"this CPU has no VNNI, so ONNX Runtime's int8 GEMMs saturate sums of two products in 16 bits: the "
            f"bundle's {' and '.join(sorted(set(passes)))} linears are less accurate here than where they were "
            "measured; run it on a CPU with AVX-512 VNNI or AVX-VNNI, or compile a recipe without those passes")
