"""Which ONNX Runtime CPU kernels run bfloat16 and int8, and what they cost against float32, on this host.

`python scripts/ort_cpu_kernels.py [--m 64] [--k 1024] [--n 1024] [--runs 20] [--threads 2]`

Each case is a one-op graph at an LLM layer's size (M tokens x K -> N; attention over M tokens of N/64 heads),
built in float32 and in the case's type: a float32 input cast to the type, the op (weights stored in the type),
the output cast back. ONNX Runtime has no fallback for a type its CPU kernel lacks: the session refuses the graph
("no CPU kernel"), which is what a recipe choosing that type would meet. A case that runs gives the median time
of `--runs` calls against float32's (the casts included; the `cast only` row is their own cost). The int8 rows
are the dynamic quantization forms `onnxruntime.quantization.quantize_dynamic` writes (DynamicQuantizeLinear +
MatMulInteger), the fused DynamicQuantizeMatMul, and MatMulNBits (int4 and int8 weights, int8 activations at
accuracy level 4). The CPU's flags (avx512_bf16, amx, avx512_vnni) are printed: a bf16 kernel without them converts.
On a CPU whose uint8 x int8 GEMM saturates (no VNNI; mmtrt/backends/int8_gemm.py) the integer forms are also timed
with ONNX Runtime's exact uint8 x uint8 GEMM, as mmtrt's runtimes run them there, with the error of the saturating
GEMM's output against it (the largest, relative to the largest output); the weights are int8 codes of normal values
per output column, as `int8_weights` writes them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from mmtrt.backends.int8_gemm import INTEGER_GEMMS, exact_products, saturates

BF16, FP16, FP32 = TensorProto.BFLOAT16, TensorProto.FLOAT16, TensorProto.FLOAT
NAMES = {BF16: "bf16", FP16: "fp16", FP32: "fp32"}


def weight(name: str, values: np.ndarray, dtype: int) -> onnx.TensorProto:
    if dtype == BF16:  # round to nearest even, as a cast would
        bits = values.astype(np.float32).view(np.uint32)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return helper.make_tensor(name, BF16, values.shape, bits.tobytes(), raw=True)
    return numpy_helper.from_array(values.astype(np.float16 if dtype == FP16 else np.float32), name)


def float_case(op: str, dtype: int, m: int, k: int, n: int, rng) -> onnx.ModelProto:
    """One op in `dtype` between casts from and to float32."""
    heads = max(n // 64, 1)
    init, extra, attrs, domain, opset = [], [], {}, "", 23
    shape = [1, m, k]
    if op in ("MatMul", "Gemm"):
        init.append(weight("w", rng.standard_normal((k, n)) / np.sqrt(k), dtype))
        extra = ["w"]
        shape = [m, k] if op == "Gemm" else shape
    elif op in ("Add", "Mul"):
        init.append(weight("w", rng.standard_normal(k), dtype))
        extra = ["w"]
    elif op in ("LayerNormalization", "RMSNormalization"):
        init += [weight("g", rng.standard_normal(k), dtype)]
        extra, attrs = ["g"], {"axis": -1}
        if op == "LayerNormalization":
            init.append(weight("b", rng.standard_normal(k), dtype))
            extra.append("b")
    elif op == "Attention":
        shape, attrs = [1, heads, m, 64], {"is_causal": 1}
    elif op == "Conv":
        shape, attrs = [1, 3, 224, 224], {"strides": [14, 14]}
        init.append(weight("w", rng.standard_normal((n, 3, 14, 14)) / 24, dtype))
        extra = ["w"]
    inputs = ["x_t"] * 3 if op == "Attention" else ["x_t", *extra]
    nodes = [helper.make_node("Cast", ["x"], ["x_t"], to=dtype),
             helper.make_node(op, inputs, ["y_t"], domain=domain, **attrs),
             helper.make_node("Cast", ["y_t"], ["y"], to=FP32)]
    if op == "Cast":
        nodes = [nodes[0], helper.make_node("Cast", ["x_t"], ["y"], to=FP32)]
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", FP32, shape)],
                              [helper.make_tensor_value_info("y", FP32, None)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def int8_case(form: str, m: int, k: int, n: int, rng) -> onnx.ModelProto:
    normal = rng.standard_normal((k, n))
    w = np.rint(normal / np.abs(normal).max(axis=0) * 127).astype(np.int8)
    scale = numpy_helper.from_array(np.array(0.01, np.float32), "s")
    init = [numpy_helper.from_array(w, "w"), scale, numpy_helper.from_array(np.array(0, np.int8), "zp")]
    if form == "DynamicQuantizeLinear + MatMulInteger":
        nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]),
                 helper.make_node("MatMulInteger", ["q", "w", "qz", "zp"], ["acc"]),
                 helper.make_node("Cast", ["acc"], ["accf"], to=FP32),
                 helper.make_node("Mul", ["qs", "s"], ["ss"]),
                 helper.make_node("Mul", ["accf", "ss"], ["y"])]
    elif form == "DynamicQuantizeMatMul":
        nodes = [helper.make_node("DynamicQuantizeMatMul", ["x", "w", "s", "zp"], ["y"], domain="com.microsoft")]
    else:  # MatMulNBits, bits 4 or 8, block 32, accuracy level 4
        bits = int(form.split()[-1].removesuffix("-bit"))
        blocks, block = k // 32, 32
        packed = rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8)
        init = [numpy_helper.from_array(packed, "w"),
                numpy_helper.from_array((rng.random(n * blocks) * 0.01).astype(np.float32), "s")]
        nodes = [helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft", K=k, N=n,
                                  bits=bits, block_size=block, accuracy_level=4)]
    graph = helper.make_graph(nodes, form, [helper.make_tensor_value_info("x", FP32, [m, k])],
                              [helper.make_tensor_value_info("y", FP32, None)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def session(model: onnx.ModelProto, threads: int, exact: bool = False) -> ort.InferenceSession | str:
    """A session on `model` (with the exact integer GEMM where `exact`), or why ONNX Runtime refused the graph."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if exact:
        exact_products(options, [n.op_type for n in model.graph.node])
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # the refusal is the result
        return "no CPU kernel" if "NOT_IMPLEMENTED" in str(exc) else f"refused: {str(exc).splitlines()[0][:90]}"


def feed(model: onnx.ModelProto, rng) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": rng.standard_normal(shape).astype(np.float32)}


def timed(model: onnx.ModelProto, runs: int, threads: int, rng, exact: bool = False) -> float | str:
    """Median ms per call, or why the session refused the graph."""
    made = session(model, threads, exact)
    if isinstance(made, str):
        return made
    x = feed(model, rng)
    made.run(None, x)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        made.run(None, x)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def saturation_error(model: onnx.ModelProto, threads: int, rng) -> float:
    """The largest difference of the saturating GEMM's output from the exact one's, relative to the largest output."""
    x = feed(model, rng)
    plain, exact = (session(model, threads, flag).run(None, x)[0] for flag in (False, True))
    return float(np.abs(plain - exact).max() / np.abs(exact).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("m", 64), ("k", 1024), ("n", 1024), ("runs", 20), ("threads", 2)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    flags = open("/proc/cpuinfo").read().split()
    print(f"onnxruntime {ort.__version__}; CPU flags: " + ", ".join(
        f for f in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags))
    print(f"M {args.m}, K {args.k}, N {args.n}; median of {args.runs} calls, {args.threads} threads\n")
    print("| op | fp32 ms | bf16 | fp16 |\n| --- | ---: | --- | --- |")
    for op in ("Cast", "MatMul", "Gemm", "Add", "Mul", "LayerNormalization", "RMSNormalization", "Attention",
               "Conv"):
        base = timed(float_case(op, FP32, args.m, args.k, args.n, rng), args.runs, args.threads, rng)
        cells = []
        for dtype in (BF16, FP16):
            t = timed(float_case(op, dtype, args.m, args.k, args.n, rng), args.runs, args.threads, rng)
            cells.append(t if isinstance(t, str) else f"{t:.3f} ms ({t / base:.2f}x)")
        print(f"| {op} | {base:.3f} | " + " | ".join(cells) + " |")
    base = timed(float_case("MatMul", FP32, args.m, args.k, args.n, rng), args.runs, args.threads, rng)
    exact = saturates()
    print(f"\n| int8 form (MatMul {args.m}x{args.k}x{args.n}) | ms | against fp32 MatMul ({base:.3f} ms) |"
          + (" exact GEMM ms | against fp32 | saturating GEMM's error |" if exact else ""))
    print("| --- | ---: | ---: |" + (" ---: | ---: | ---: |" if exact else ""))
    for form in ("DynamicQuantizeLinear + MatMulInteger", "DynamicQuantizeMatMul", "MatMulNBits 8-bit",
                 "MatMulNBits 4-bit"):
        model = int8_case(form, args.m, args.k, args.n, rng)
        t = timed(model, args.runs, args.threads, rng)
        row = f"| {form} | " + (f"{t:.3f} | {t / base:.2f}x |" if not isinstance(t, str) else f"{t} | |")
        if exact and INTEGER_GEMMS.intersection(n.op_type for n in model.graph.node):
            u = timed(model, args.runs, args.threads, rng, exact=True)
            row += f" {u:.3f} | {u / base:.2f}x | {saturation_error(model, args.threads, rng):.2%} |"
        elif exact:
            row += " | | |"
        print(row)


if __name__ == "__main__":
    main()
