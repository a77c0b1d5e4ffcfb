"""Networks with mmtrt's plugin nodes built by TensorRT-RTX's real ONNX parser and builder on the CPU, in a process
of their own (registering plugin creators is process-wide): `python tests/rtx_plugin_builds.py` prints one JSON
record per case. tests/kernels/test_rtx_plugins.py runs it and checks the records."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from builders import make_model, tensor  # noqa: E402
from mmtrt.ir.graph import Component  # noqa: E402
from mmtrt.kernels import rtx  # noqa: E402
from mmtrt.kernels.catalog import PLUGINS  # noqa: E402
from mmtrt.quant.int4 import dequantize_linear_nodes, quantize_groups  # noqa: E402
from passes.fusion.fuse_plugins import FusePlugins, FusePluginsConfig  # noqa: E402
from passes.fusion.plugin_nodes import add_function, plugin_node  # noqa: E402

H, T = TensorProto.FLOAT16, TensorProto.FLOAT
N, HEADS, TOKENS, HEAD_DIM, DIM, KEEP, K, OUT = 2, 4, 16, 8, 32, 8, 128, 64


def one_node(key: str, inputs: list, outputs: list, attrs: dict, initializers=()) -> onnx.ModelProto:
    """A model of one plugin node, as fuse_plugins writes it (with its local function)."""
    node = plugin_node(PLUGINS[key], [i.name for i in inputs] + [t.name for t in initializers],
                       [o.name for o in outputs], f"{key}_node", **attrs)
    model = make_model([node], inputs, outputs, opset=21)
    model.graph.initializer.extend(initializers)
    add_function(model, key)
    return model


def cases() -> dict[str, tuple[onnx.ModelProto, dict]]:
    rng = np.random.default_rng(0)
    kv = TOKENS + 1
    q, k = tensor("q", ["n", HEADS, kv, HEAD_DIM], H), tensor("k", ["n", HEADS, kv, HEAD_DIM], H)
    feats, scores = tensor("features", ["n", TOKENS, DIM], H), tensor("scores", ["n", TOKENS], T)
    selected = tensor("selected", ["n", KEEP, DIM], H)
    positions = [numpy_helper.from_array(np.array([1, 3], np.int32), "target_at"),
                 numpy_helper.from_array(np.array([0, 2, 4, 5, 6, 7], np.int32), "merged_at")]
    gemm = [numpy_helper.from_array(rng.integers(-128, 128, (K, OUT // 2), dtype=np.int8), "weight"),
            numpy_helper.from_array(rng.uniform(0.01, 0.1, (2, OUT)).astype(np.float16), "scales"),
            numpy_helper.from_array(np.ones(K, np.float16), "pre")]
    bf16_scales = [gemm[0], numpy_helper.from_array(np.zeros((2, OUT), np.uint16), "scales"), gemm[2]]
    bf16_scales[1].data_type = TensorProto.BFLOAT16
    vision = {"q": [(1, HEADS, kv, HEAD_DIM), (2, HEADS, kv, HEAD_DIM), (4, HEADS, kv, HEAD_DIM)],
              "k": [(1, HEADS, kv, HEAD_DIM), (2, HEADS, kv, HEAD_DIM), (4, HEADS, kv, HEAD_DIM)],
              "features": [(1, TOKENS, DIM), (2, TOKENS, DIM), (4, TOKENS, DIM)]}
    scored = {"scores": [(1, TOKENS), (2, TOKENS), (4, TOKENS)], "features": vision["features"]}
    rows = {"x": [(1, K), (1, K), (8, K)]}
    return {
        "TokenSelect": (one_node("token_select", [q, k, feats], [selected], {"keep": KEEP, "cls": 1, "scale": 0.35}),
                        vision),
        "TokenSelectMerge": (one_node("token_select_merge", [q, k, feats], [selected],
                                      {"keep": KEEP, "cls": 1, "scale": 0.35, "contextual": 2}, positions), vision),
        "TokenSelectScored": (one_node("token_select_scored", [scores, feats], [selected], {"keep": KEEP}), scored),
        "TokenSelectDynamic": (one_node("token_select_dynamic", [scores, feats],
                                        [selected, tensor("count", ["n"], TensorProto.INT32)],
                                        {"most": KEEP, "least": 2, "mass": 0.9}), scored),
        "Int4GroupGemm": (one_node("int4_gemm", [tensor("x", ["m", K], H)], [tensor("y", ["m", OUT], H)],
                                   {"group_size": 64}, gemm), rows),
        "Int4GroupGemm bf16 scales": (one_node("int4_gemm", [tensor("x", ["m", K], H)], [tensor("y", ["m", OUT], H)],
                                               {"group_size": 64}, bf16_scales), rows),
        "fused linear": (fused_linear(rng), {"x": [(1, K), (1, K), (8, K)]}),
    }


def fused_linear(rng) -> onnx.ModelProto:
    """awq_int4's TensorRT form of a linear ([Mul(pre)] -> MatMul <- Cast <- DequantizeLinear) after fuse_plugins."""
    q, scales, _ = quantize_groups(rng.standard_normal((OUT, K)).astype(np.float32), 64)
    nodes, inits = dequantize_linear_nodes("lin", "xs", "y_raw", q, scales, 64)
    dq, matmul = nodes
    matmul.input[1] = "w16"
    graph = [helper.make_node("Mul", ["x", "pre"], ["xs"]), dq, helper.make_node("Cast", [dq.output[0]], ["w16"], to=H),
             matmul, helper.make_node("Relu", ["y_raw"], ["y"])]
    model = make_model(graph, [tensor("x", ["m", K], H)], [tensor("y", ["m", OUT], H)], opset=21)
    model.graph.initializer.extend([*inits, numpy_helper.from_array(rng.uniform(0.5, 2, K).astype(np.float16), "pre")])
    comp = Component.__new__(Component)
    comp.name, comp.onnx = "llm", model
    comp.metadata = {"placement": {"targeted": True, "min_segment_size": 1}}
    report = FusePlugins(FusePluginsConfig(plugins=["int4_gemm"])).run(SimpleNamespace(components={"llm": comp}))
    assert report["llm"]["fused"] == {"mmtrt::Int4GroupGemm": 1}, report
    return comp.onnx


def build(trt, model: onnx.ModelProto, profile: dict) -> dict:
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    parsed = parser.parse(model.SerializeToString())
    record = {"parsed": bool(parsed), "errors": [str(parser.get_error(i)) for i in range(parser.num_errors)],
              "layers": [network.get_layer(i).type.name for i in range(network.num_layers)],
              "outputs": [list(network.get_output(i).shape) for i in range(network.num_outputs)]}
    config = builder.create_builder_config()
    shapes = builder.create_optimization_profile()
    for name, (low, opt, high) in profile.items():
        shapes.set_shape(name, low, opt, high)
    config.add_optimization_profile(shapes)
    engine = builder.build_serialized_network(network, config) if parsed else None
    blob = b"" if engine is None else bytes(engine)
    return {**record, "engine_bytes": len(blob), "names_in_engine": [n for n in (*PLUGIN_NAMES, "mmtrt")
                                                                     if n.encode() in blob]}


PLUGIN_NAMES = tuple(spec.name for spec in PLUGINS.values())


def main() -> None:
    import tensorrt_rtx as trt

    rtx.register(trt)
    print(json.dumps({name: build(trt, model, profile) for name, (model, profile) in cases().items()}))


if __name__ == "__main__":
    main()
