"""fuse_plugins on hand-built graphs: each pattern as token_prune and awq_int4 write it (should match), and the
variants it must leave alone (should not match). A fused graph runs on ONNX Runtime through the plugin's local
function exactly as before, and the CPU twin of the kernel agrees with it."""

import math
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from builders import make_model, tensor
from mmtrt.ir.graph import Component
from mmtrt.kernels import cpu
from mmtrt.partition.placement import place
from mmtrt.quant.int4 import dequantize_linear_nodes, quantize_groups
from passes.fusion.fuse_plugins import FusePlugins, FusePluginsConfig
from passes.vision import token_criteria as tc
from passes.vision import token_prune as tp

N, HEADS, TOKENS, CLS, HEAD_DIM, DIM, KEEP = 2, 4, 36, 1, 8, 12, 9


def component(model, name="vision", targeted=True):
    comp = Component.__new__(Component)
    comp.name, comp.onnx = name, model
    comp.metadata = {"placement": {"targeted": targeted, "min_segment_size": 1}}
    return comp


def fuse(model, name="vision", targeted=True, plugins=("token_select", "int4_gemm")):
    comp = component(model, name, targeted)
    report = FusePlugins(FusePluginsConfig(plugins=list(plugins))).run(SimpleNamespace(components={name: comp}))
    onnx.checker.check_model(comp.onnx, full_check=True)
    return comp.onnx, report[name]


def run(model, feeds):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def token_select_graph(extra_output: str | None = None, mask: bool = False):
    """token_prune's own builder: [CLS] attention scores, TopK, sorted indices, GatherND."""
    kv = TOKENS + CLS
    inputs = [tensor("q", [N, HEADS, kv, HEAD_DIM]), tensor("k", [N, HEADS, kv, HEAD_DIM]), tensor("features", [N, TOKENS, DIM])]
    model = make_model([], inputs, [tensor("selected", [N, KEEP, DIM])])
    b = tc.Builder(model.graph)
    attention = helper.make_node("Attention", ["q", "k", "k", *(["mask"] if mask else [])], ["att"])
    facts = SimpleNamespace(shape=lambda name: [N, HEADS, kv, HEAD_DIM], types={"mask": TensorProto.FLOAT})
    if mask:
        model.graph.input.append(tensor("mask", [N, HEADS, kv, kv]))
    budget = tp.Budget(TOKENS, KEEP, 0, 0, CLS, True)
    scores = tc.cls_attention(b, attention, facts, budget.tokens, budget.cls)
    out = tp._select(b, "features", scores, None, budget)
    model.graph.node.append(helper.make_node("Identity", [out], ["selected"]))
    if extra_output:
        indices = next(n for n in model.graph.node if n.op_type == "Unsqueeze").input[0]
        model.graph.node.append(helper.make_node("Identity", [indices], [extra_output]))
        model.graph.output.append(tensor(extra_output, [N, KEEP], TensorProto.INT64))
    return model


def token_feeds(rng):
    kv = TOKENS + CLS
    return {"q": rng.standard_normal((N, HEADS, kv, HEAD_DIM)).astype(np.float32),
            "k": rng.standard_normal((N, HEADS, kv, HEAD_DIM)).astype(np.float32),
            "features": rng.standard_normal((N, TOKENS, DIM)).astype(np.float32)}


def test_token_select_fuses_into_one_plugin_node_that_runs_as_before():
    rng = np.random.default_rng()
    model = token_select_graph()
    feeds = token_feeds(rng)
    before = run(model, feeds)[0]
    fused, report = fuse(model)
    assert report["fused"] == {"mmtrt::TokenSelect": 1}
    plugin = [n for n in fused.graph.node if n.domain == "mmtrt"]
    assert [n.op_type for n in plugin] == ["TokenSelect"] and list(plugin[0].input) == ["q", "k", "features"]
    attrs = {a.name: helper.get_attribute_value(a) for a in plugin[0].attribute}
    assert attrs["keep"] == KEEP and attrs["cls"] == CLS and attrs["plugin_namespace"] == b"mmtrt"
    assert attrs["plugin_version"] == b"1" and attrs["aot"] == 1
    assert math.isclose(attrs["scale"], 1 / math.sqrt(HEAD_DIM), rel_tol=1e-6)
    assert not any(n.op_type in ("TopK", "GatherND", "Softmax") for n in fused.graph.node)
    after = run(fused, feeds)[0]
    np.testing.assert_array_equal(after, before)
    twin, _, _ = cpu.token_select(feeds["q"], feeds["k"], feeds["features"], KEEP, CLS)
    np.testing.assert_array_equal(twin, after)


def test_token_select_is_placed_on_tensorrt_and_listed_per_segment():
    fused, _ = fuse(token_select_graph())
    placement = place(fused, "vision", True, 1)
    report = placement.to_json()
    node = next(n for n in report["nodes"] if n["op"] == "TokenSelect")
    assert node["backend"] == "tensorrt" and node["reason"].startswith("mmtrt plugin mmtrt::TokenSelect v1")
    assert [s["plugins"] for s in report["segments"]] == [["mmtrt::TokenSelect"]]


def test_token_select_leaves_indices_another_node_reads():
    fused, report = fuse(token_select_graph(extra_output="kept_indices"))
    assert report["fused"] == {}
    assert any("consumers" in why for why in report["not_fused"])
    assert not any(n.domain == "mmtrt" for n in fused.graph.node)


def test_masked_attention_scores_stay_standard_ops_and_feed_token_select_scored():
    """TokenSelect scores without a mask; a masked [CLS] attention is scored by the graph and selected by the plugin."""
    rng = np.random.default_rng()
    model, feeds = token_select_graph(mask=True), token_feeds(rng)
    feeds["mask"] = rng.normal(size=(N, HEADS, TOKENS + CLS, TOKENS + CLS)).astype(np.float32)
    before = run(model, feeds)[0]
    fused, report = fuse(model)
    assert report["fused"] == {"mmtrt::TokenSelectScored": 1}
    node = next(n for n in fused.graph.node if n.domain == "mmtrt")
    assert node.input[1] == "features" and any(n.op_type == "Softmax" for n in fused.graph.node)
    np.testing.assert_array_equal(run(fused, feeds)[0], before)


def test_onnx_runtime_segments_keep_standard_ops():
    fused, report = fuse(token_select_graph(), targeted=False)
    assert report == {"tensorrt_nodes": 0, "fused": {}, "not_fused": {}}
    assert not fused.functions


K, OUT, ROWS = 256, 96, 3


def int4_graph(group=64, prequant=True, share_weight=False, dtype=TensorProto.FLOAT16):
    """awq_int4's TensorRT lowering after cast_precision: [Mul(pre)] -> MatMul <- Cast <- DequantizeLinear."""
    rng = np.random.default_rng()
    q, scales, _ = quantize_groups(rng.standard_normal((OUT, K)).astype(np.float32), group)
    nodes, inits = dequantize_linear_nodes("lin", "xs" if prequant else "x", "y_raw", q, scales, group)
    np_t = helper.tensor_dtype_to_np_dtype(dtype)
    dq, matmul = nodes
    cast = helper.make_node("Cast", [dq.output[0]], ["w_low"], to=dtype)
    matmul.input[1] = "w_low"
    graph_nodes = [dq, cast, matmul, helper.make_node("Identity", ["y_raw"], ["y"])]
    extra = []
    if prequant:
        pre = rng.uniform(0.5, 2, K).astype(np_t)
        inits.append(numpy_helper.from_array(pre, "pre"))
        graph_nodes.insert(0, helper.make_node("Mul", ["x", "pre"], ["xs"]))
    outputs = [tensor("y", [ROWS, OUT], dtype)]
    if share_weight:
        graph_nodes.append(helper.make_node("Identity", ["w_low"], ["w_out"]))
        outputs.append(tensor("w_out", [K, OUT], dtype))
    model = make_model(graph_nodes, [tensor("x", [ROWS, K], dtype)], outputs)
    model.graph.initializer.extend(inits + extra)
    return model, q, scales


def test_int4_gemm_fuses_with_the_prequant_scale_and_runs_as_before():
    model, q, scales = int4_graph()
    x = np.random.default_rng().standard_normal((ROWS, K)).astype(np.float16)
    before = run(model, {"x": x})[0]
    fused, report = fuse(model, "llm")
    assert report["fused"] == {"mmtrt::Int4GroupGemm": 1}
    node = next(n for n in fused.graph.node if n.domain == "mmtrt")
    assert node.op_type == "Int4GroupGemm" and list(node.input) == ["x", "lin.weight.int8_pairs", "lin.weight_scale", "pre"]
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "group_size")) == 64
    assert not any(n.op_type in ("DequantizeLinear", "MatMul", "Mul") for n in fused.graph.node)
    after = run(fused, {"x": x})[0]
    np.testing.assert_array_equal(after, before)
    weights = {t.name: t for t in fused.graph.initializer}
    packed = numpy_helper.to_array(weights["lin.weight.int8_pairs"])
    assert packed.dtype == np.int8 and packed.shape == (K, OUT // 2)  # TensorRT takes no INT4 plugin input
    assert "lin.weight" not in weights  # the INT4 initializer went with its DequantizeLinear
    twin = cpu.int4_gemm(x, packed, numpy_helper.to_array(weights["lin.weight_scale"]),
                         numpy_helper.to_array(weights["pre"]), 64)
    # the graph's math in float64 (ONNX Runtime's CPU fp16 MatMul itself rounds on the way): products rounded to
    # fp16 where the graph rounds them, then the twin's fp32 sum is within the sum's bound plus one fp16 rounding
    pre = numpy_helper.to_array(weights["pre"]).astype(np.float32)
    xs = (x.astype(np.float32) * pre).astype(np.float16).astype(np.float64)
    w = (q.T.astype(np.float32) * np.repeat(scales.T, 64, axis=0)).astype(np.float16).astype(np.float64)
    expect = xs @ w
    bound = K * 2.0 ** -23 * (np.abs(xs) @ np.abs(w)) + np.exp2(np.floor(np.log2(np.abs(expect))) - 10)
    assert (np.abs(twin.astype(np.float64) - expect) <= bound).all()


def test_int4_gemm_without_prequant_scale_gets_ones():
    model, _, _ = int4_graph(prequant=False, dtype=TensorProto.FLOAT)
    x = np.random.default_rng().standard_normal((ROWS, K)).astype(np.float32)
    before = run(model, {"x": x})[0]
    fused, report = fuse(model, "llm")
    assert report["fused"] == {"mmtrt::Int4GroupGemm": 1}
    ones = next(t for t in fused.graph.initializer if t.name.startswith("fuse_plugins.ones"))
    assert (numpy_helper.to_array(ones) == 1).all() and list(ones.dims) == [K]
    np.testing.assert_array_equal(run(fused, {"x": x})[0], before)


def test_int4_gemm_leaves_a_group_size_the_kernel_does_not_take():
    """Block 32 is neither the kernel's nor TensorRT's: placement keeps the DequantizeLinear on ONNX Runtime."""
    fused, report = fuse(int4_graph(group=32)[0], "llm")
    assert report["fused"] == {} and any("runs on ONNX Runtime" in why for why in report["not_fused"])
    assert any(n.op_type == "DequantizeLinear" for n in fused.graph.node)


def test_int4_gemm_leaves_a_weight_another_node_reads():
    fused, report = fuse(int4_graph(share_weight=True)[0], "llm")
    assert report["fused"] == {} and any("consumers" in why for why in report["not_fused"])
    assert any(n.op_type == "DequantizeLinear" for n in fused.graph.node)


def test_plugins_option_selects_what_is_fused():
    model, _, _ = int4_graph()
    _, report = fuse(model, "llm", plugins=["token_select"])
    assert report["fused"] == {}


def test_a_split_component_keeps_the_plugin_function_in_its_segment_file():
    """A node TensorRT cannot run (Det) after the selection splits the graph; the TensorRT segment's file carries
    the TokenSelect function, the ONNX Runtime segment's file none, and both pass the checker."""
    from mmtrt.partition.segments import extract

    model = token_select_graph()
    model.graph.node.append(helper.make_node("Reshape", ["selected", "square"], ["square_rows"]))
    model.graph.node.append(helper.make_node("Det", ["square_rows"], ["det"]))
    model.graph.initializer.append(numpy_helper.from_array(np.array([N, KEEP * DIM // 9, 3, 3], np.int64), "square"))
    model.graph.output.append(tensor("det", [N, KEEP * DIM // 9]))
    fused, _ = fuse(model)
    placement = place(fused, "vision", True, 1)
    files = {s.backend: extract(placement, s) for s in placement.segments}
    assert set(files) == {"tensorrt", "onnxruntime"}
    assert [(f.domain, f.name) for f in files["tensorrt"].functions] == [("mmtrt", "TokenSelect")]
    assert not files["onnxruntime"].functions
    for f in files.values():
        onnx.checker.check_model(f, full_check=True)


def merge_graph(contextual=3, extra_output=False):
    """token_prune's builder with merge: contextual (VisionZip)."""
    kv = TOKENS + CLS
    inputs = [tensor("q", [N, HEADS, kv, HEAD_DIM]), tensor("k", [N, HEADS, kv, HEAD_DIM]), tensor("features", [N, TOKENS, DIM])]
    model = make_model([], inputs, [tensor("selected", [N, KEEP, DIM])])
    b = tc.Builder(model.graph)
    attention = helper.make_node("Attention", ["q", "k", "k"], ["att"])
    facts = SimpleNamespace(shape=lambda name: [N, HEADS, kv, HEAD_DIM], types={})
    budget = tp.Budget(TOKENS, KEEP, contextual, 0, CLS, True)
    out = tp._select(b, "features", tc.cls_attention(b, attention, facts, budget.tokens, budget.cls), tp._unit_keys(b, attention, budget), budget)
    model.graph.node.append(helper.make_node("Identity", [out], ["selected"]))
    if extra_output:
        argmax = next(n for n in model.graph.node if n.op_type == "ArgMax").output[0]
        model.graph.node.append(helper.make_node("Identity", [argmax], ["nearest_out"]))
        merged = TOKENS - (KEEP - contextual) - contextual
        model.graph.output.append(tensor("nearest_out", [N, merged, 1], TensorProto.INT64))
    return model


def test_token_select_with_visionzip_merge_fuses_and_runs_as_before():
    rng = np.random.default_rng()
    model, feeds = merge_graph(), token_feeds(rng)
    before = run(model, feeds)[0]
    fused, report = fuse(model)
    assert report["fused"] == {"mmtrt::TokenSelectMerge": 1}
    node = next(n for n in fused.graph.node if n.domain == "mmtrt")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert node.op_type == "TokenSelectMerge" and attrs["keep"] == KEEP and attrs["contextual"] == 3
    assert not any(n.op_type in ("TopK", "ArgMax", "GatherND") for n in fused.graph.node)
    after = run(fused, feeds)[0]
    np.testing.assert_array_equal(after, before)
    weights = {t.name: numpy_helper.to_array(t) for t in fused.graph.initializer}
    twin, _, _ = cpu.token_select(feeds["q"], feeds["k"], feeds["features"], KEEP, CLS, target_at=weights[node.input[3]])
    dominant = KEEP - 3
    np.testing.assert_array_equal(twin[:, :dominant], after[:, :dominant])
    np.testing.assert_allclose(twin[:, dominant:], after[:, dominant:], rtol=1e-5, atol=1e-5)


def test_token_select_merge_leaves_a_similarity_another_node_reads():
    fused, report = fuse(merge_graph(extra_output=True))
    assert report["fused"] == {} and any("outside the selection" in why or "graph output" in why for why in report["not_fused"])


def test_token_select_merge_after_cast_precision_keeps_the_output_type():
    """cast_precision lowers the merge to fp16 around fp32 features; the plugin computes in the features' type
    and a Cast hands the consumers fp16 again (the fused result is the fp32 merge, rounded once)."""
    from passes.precision.cast_precision import CastPrecision, CastPrecisionConfig

    model, feeds = merge_graph(), token_feeds(np.random.default_rng())
    model.graph.node.append(helper.make_node("MatMul", ["selected", "proj"], ["projected"]))
    model.graph.initializer.append(numpy_helper.from_array(np.eye(DIM, dtype=np.float32), "proj"))
    model.graph.output.append(tensor("projected", [N, KEEP, DIM]))
    comp = component(model)
    CastPrecision(CastPrecisionConfig(dtype="fp16"))._lower(comp)
    lowered = onnx.ModelProto()
    lowered.CopyFrom(comp.onnx)
    before = run(lowered, feeds)[1]
    fused, report = fuse(comp.onnx)
    assert report["fused"] == {"mmtrt::TokenSelectMerge": 1}
    assert any(n.op_type == "Cast" and n.input[0].endswith("__plugin") for n in fused.graph.node)
    after = run(fused, feeds)[1]
    reference = run(merge_graph(), feeds)[0]
    np.testing.assert_allclose(after, reference, rtol=2e-3, atol=2e-3)  # fp32 merge, fp16 round trips
    np.testing.assert_allclose(after, before, rtol=1e-2, atol=1e-2)
