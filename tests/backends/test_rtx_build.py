"""Real TensorRT engines on the CPU: TensorRT-RTX's builder (its CPU-only AOT mode) parses and builds every TensorRT
segment of tiny-llava, fp32 and under the recipe forms that change the graph (fp16, awq_int4's INT4
DequantizeLinear, kv_layout static's TensorScatter + Attention, token_prune, channel_prune); placement agrees with
its ONNX parser; a failing segment is reported with the builder's words and the others are still built.
TensorRT-RTX is the same API and parser as TensorRT 11 (mmtrt/backends/tensorrt/flavors.py). No GPU here: the
engines are built, never run."""

import json
import shutil

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import compile_to
from mmtrt.backends.tensorrt.engines import read_index
from mmtrt.backends.tensorrt.kv_cache_form import has_gqa, tensorrt_form
from mmtrt.backends.tensorrt.parser_form import tensorrt_form as parser_form
from mmtrt.bundle.inspect import describe
from mmtrt.bundle.manifest import read_manifest
from mmtrt.cli import main
from mmtrt.partition.placement import place
from mmtrt.quant.int4 import dequantize_linear_nodes, quantize_groups
from mmtrt.runtime import load

trt = pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is installed by `make test` (pyproject extra rtx)")

# Every recipe form that changes the TensorRT segments' graphs, in one tiny compile that ships its engines.
FORMS = """model: {source: zoo, name: tiny-llava}
passes:
  - dead_layer_elimination: {}
  - token_prune: {keep: 0.5}
  - channel_prune: {importance: l2, vision: {mlp: 0.25}, llm: {mlp: 0.25, heads: 0.5}}
  - awq_int4: {method: rtn, calibration: {images: none, text_windows: 1, search_tokens: 64}}
  - graph_cleanup: {}
  - cast_precision: {dtype: fp16}
  - kv_layout: {layout: static}
envelope: {batch: {min: 1, opt: 1, max: 2}, prompt_tokens: {min: 1, opt: 16, max: 64}, max_new_tokens: 8}
output: {engines: [rtx]}
"""


@pytest.fixture(scope="module")
def forms_bundle(tmp_path_factory):
    return compile_to(tmp_path_factory.mktemp("rtx-forms"), FORMS)


def rtx_records(bundle):
    return {r["segment"]: r for r in read_index(bundle).values() if r["flavor"] == "rtx"}


def test_fp32_segments_build_and_the_index_and_inspect_list_them(tiny_bundle, tmp_path, capsys):
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    assert main(["build-engines", str(bundle), "--target", "rtx", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    plan = read_manifest(bundle)["tensorrt"]["segments"]
    assert [r["segment"] for r in records] == [e["id"] for e in plan] == ["vision.0", "llm.0"]
    assert all(r["status"] == "built" and r["target"] == "rtx1.7.1.116-sm80_86_89_120" for r in records)
    for record in records:
        assert (bundle / record["file"]).stat().st_size == record["engine_bytes"] > 100_000
    assert set(rtx_records(bundle)) == {"vision.0", "llm.0"}
    assert all(r["file"] in describe(bundle) for r in records)
    assert main(["build-engines", str(bundle), "--target", "rtx"]) == 0
    assert capsys.readouterr().out.strip().endswith("0 built, 2 up to date, 0 skipped, 0 failed")
    # the runtime finds them and says why it cannot use them on this host (no GPU), once per segment
    fallbacks = load(bundle).fallbacks
    for record in records:
        assert f"TensorRT-RTX engine {record['file']} not loaded: " in fallbacks[record["segment"]]
        assert "no CUDA GPU is visible" in fallbacks[record["segment"]]


def test_the_recipe_forms_ship_with_their_engines(forms_bundle):
    """output.engines: [rtx] built every TensorRT segment at compile time (a failure would have failed it)."""
    m = read_manifest(forms_bundle)
    planned = [e["id"] for e in m["tensorrt"]["segments"]]
    built = rtx_records(forms_bundle)
    assert planned and set(built) == set(planned)
    report = json.loads((forms_bundle / "build_report.json").read_text())["engines"]
    assert {r["segment"] for r in report if r["status"] == "built"} == set(planned)
    assert all(r["file"] not in m["artifacts"] for r in built.values())  # engines stay out of the bundle's hash
    llm = next(e for e in m["tensorrt"]["segments"] if e["component"] == "llm")
    assert llm["onnx"] == "llm.0.segment.onnx" and llm["precision"]["dtype"] == "fp16"
    assert llm["files"] == ["llm.0.segment.onnx", "llm.onnx.data"]  # the INT4 weights llm.onnx reads, not a copy
    assert all(p["values"] == {"logits_from": {"min": [0], "opt": [p["shapes"]["inputs_embeds"]["opt"][1] - 1],
                                               "max": [p["shapes"]["inputs_embeds"]["max"][1] - 1]}}
               for p in llm["profiles"])


def network_of(path):
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network()
    parser = trt.OnnxParser(network, logger)
    assert parser.parse_from_file(str(path)), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    return builder, network, parser


def test_shape_tensor_inputs_are_the_ones_the_profiles_give_values(tiny_bundle, forms_bundle):
    for bundle in (tiny_bundle, forms_bundle):
        for entry in read_manifest(bundle)["tensorrt"]["segments"]:
            builder, network, parser = network_of(bundle / entry.get("tensorrt_onnx", entry["onnx"]))
            shape_inputs = {network.get_input(i).name for i in range(network.num_inputs)
                            if network.get_input(i).is_shape_tensor}
            assert all(set(p.get("values", {})) == shape_inputs for p in entry["profiles"]), entry["id"]


def test_the_static_cache_form_writes_present_in_place(forms_bundle):
    """IKVCacheUpdateLayer's output is the engine's present.N.*: ICudaEngine.get_aliased_input_tensor names past.N.*
    for it, and the runners bind it there (Polygraphy's TrtRunner; the C++ TrtRunner)."""
    entry = next(e for e in read_manifest(forms_bundle)["tensorrt"]["segments"] if e["component"] == "llm")
    builder, network, parser = network_of(forms_bundle / entry["tensorrt_onnx"])
    updates = [network.get_layer(i) for i in range(network.num_layers)
               if network.get_layer(i).type == trt.LayerType.KV_CACHE_UPDATE]
    assert len(updates) == 8
    outputs = {network.get_output(i).name for i in range(network.num_outputs)}
    assert {u.get_output(0).name for u in updates} == {f"present.{n}.{k}" for n in range(4) for k in ("key", "value")}
    assert {u.get_output(0).name for u in updates} <= outputs
    assert {u.get_input(0).name for u in updates} == {f"past.{n}.{k}" for n in range(4) for k in ("key", "value")}


def parses(model) -> bool:
    logger = trt.Logger(trt.Logger.INTERNAL_ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network()  # the parser holds neither: keep them alive while it runs
    return trt.OnnxParser(network, logger).parse(model.SerializeToString())


def alone(model, placement, index: int):
    """Node `index` of `model` as a model of its own: its computed inputs are graph inputs typed as placement's
    shape inference typed them, its constants stay constants."""
    node = model.graph.node[index]
    facts = placement.facts
    consts = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant"}
    inits = [t for t in model.graph.initializer if t.name in node.input]
    inputs = [helper.make_tensor_value_info(name, facts.types[name], facts.shapes.get(name))
              for name in dict.fromkeys(node.input) if name and name not in consts and name not in
              {t.name for t in inits}]
    outputs = [helper.make_tensor_value_info(name, facts.types.get(name, 0), None) for name in node.output if name]
    graph = helper.make_graph([*(consts[n] for n in node.input if n in consts), node], "one", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version,
                             functions=model.functions)


def check_against_parser(model, component):
    """Every node placement gives TensorRT parses in the parser's form, and every node it keeps from TensorRT for
    what the node is (op, dtype, attribute, shape; not segment size or the recipe's policy) does not."""
    placement = place(model, component, True, 1)
    trt_form = onnx.ModelProto()
    trt_form.CopyFrom(model)
    parser_form(trt_form)
    for i, (node, verdict) in enumerate(zip(model.graph.node, placement.verdicts)):
        if node.op_type == "Constant" or (verdict is not None and verdict.kind in ("segment", "policy")):
            continue
        assert parses(alone(trt_form, placement, i)) == (verdict is None), (component, node.name, node.op_type, verdict)
    return placement


def test_placement_agrees_with_the_parser_on_the_bundles(tiny_bundle, forms_bundle):
    for bundle in (tiny_bundle, forms_bundle):
        m = read_manifest(bundle)
        for comp, report in m["placement"].items():
            if "tensorrt" not in m["partitions"][comp]["candidates"]:
                continue
            model = onnx.load(bundle / m["components"][comp]["artifact"])
            if has_gqa(model):
                model = tensorrt_form(model, m["dims"])
            placement = check_against_parser(model, comp)
            assert [n["backend"] for n in report["nodes"]] == [
                "tensorrt" if v is None else "onnxruntime" for v in placement.verdicts]


def test_placement_agrees_with_the_parser_where_it_refuses_nodes(rng):
    """Nodes the parser refuses go to ONNX Runtime with its reason: a partial INT4 block (K = 576, block 128,
    written as ONNX allows: five scale rows), an antialiased Resize, a custom-domain op; the rest is taken."""
    q = rng.integers(-8, 8, size=(576, 8)).astype(np.int8)
    inits = [numpy_helper.from_array(q.astype(ml_dtypes.int4), "w"),
             numpy_helper.from_array(rng.uniform(0.1, 1, (5, 8)).astype(np.float32), "s"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wd"], axis=0, block_size=128, name="dq"),
             helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm"),
             helper.make_node("Relu", ["y"], ["r"], name="relu"),
             helper.make_node("Resize", ["img", "", "scales"], ["big"], mode="linear", antialias=1, name="resize"),
             helper.make_node("Sigmoid", ["big"], ["sig"], name="sigmoid"),
             helper.make_node("FastGelu", ["r"], ["g"], domain="com.microsoft", name="gelu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 576]),
                                           helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 8]),
                               helper.make_tensor_value_info("sig", TensorProto.FLOAT, [1, 3, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    placement = check_against_parser(model, "vision")
    reasons = {n.name: v for n, v in zip(model.graph.node, placement.verdicts)}
    assert "must divide into whole blocks" in reasons["dq"].reason and reasons["mm"] is None
    assert reasons["resize"].kind == "attribute" and reasons["gelu"].kind == "op"


@pytest.mark.parametrize("k,group", [(576, 128), (288, 128)])
def test_int4_weights_with_a_partial_last_group_parse(rng, tmp_path, k, group):
    """dino-smollm's K = 576 at group 128, and a channel-pruned K = 288: TensorRT's parser takes the whole-block form."""
    q, scales, _ = quantize_groups(rng.normal(size=(8, k)).astype(np.float32), group)
    nodes, inits = dequantize_linear_nodes("lin", "x", "y", q, scales, group)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), tmp_path / "m.onnx")
    builder, network, parser = network_of(tmp_path / "m.onnx")
    assert builder.build_serialized_network(network, builder.create_builder_config()) is not None


def test_each_segment_gets_its_result_and_the_exit_code_says_not_all_built(tiny_bundle, tmp_path, capsys):
    """The parser's form of vision.0 without TRT_decomposable: the builder's own message (no fused kernel for an
    fp32 attention); llm.0 with an op the parser does not know: the parser's message. Both reported, exit 1."""
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    plan = {e["id"]: e for e in read_manifest(bundle)["tensorrt"]["segments"]}
    vision = onnx.load(bundle / plan["vision.0"]["tensorrt_onnx"], load_external_data=False)
    for node in vision.graph.node:
        for a in [a for a in node.attribute if a.name == "TRT_decomposable"]:
            node.attribute.remove(a)
    onnx.save(vision, bundle / plan["vision.0"]["tensorrt_onnx"])
    llm = onnx.load(bundle / plan["llm.0"]["tensorrt_onnx"], load_external_data=False)
    next(n for n in llm.graph.node if n.op_type == "RMSNormalization").op_type = "NoSuchOp"
    onnx.save(llm, bundle / plan["llm.0"]["tensorrt_onnx"])
    assert main(["build-engines", str(bundle), "--target", "rtx", "--json"]) == 1
    records = {r["segment"]: r for r in json.loads(capsys.readouterr().out)}
    assert records["vision.0"]["status"] == "failed" and records["vision.0"]["stage"] == "build"
    assert "Attention operation was not supported by a dedicated kernel" in records["vision.0"]["reason"]
    assert records["llm.0"]["status"] == "failed" and records["llm.0"]["stage"] == "parse"
    assert "(NoSuchOp): " in records["llm.0"]["reason"] and "Plugin not found" in records["llm.0"]["reason"]
    assert read_index(bundle) == {}


def test_plan_names_real_files_and_says_why_a_target_is_not_resolved(tiny_bundle, capsys):
    assert main(["build-engines", str(tiny_bundle), "--target", "rtx", "--plan"]) == 0
    text = capsys.readouterr().out
    assert "{" not in text and "engines/vision.0-" in text and "rtx1.7.1.116-sm80_86_89_120.engine" in text
    assert f"mmtrt build-engines {tiny_bundle} --target rtx --segment llm.0" in text
    assert main(["build-engines", str(tiny_bundle), "--target", "rtx", "--plan", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["resolved"] == "rtx1.7.1.116-sm80_86_89_120" and "trtexec" not in report["segments"][0]


def test_the_targets_are_among_what_tensorrt_rtx_can_target():
    from mmtrt.backends.tensorrt.flavors import RTX_COMPUTE_CAPABILITIES, RTX_SUPPORTED

    members = [m[2:] for m in trt.ComputeCapability.__members__ if m.startswith("SM")]
    assert set(RTX_SUPPORTED) == {f"{m[:-1]}.{m[-1]}" for m in members}
    assert set(RTX_COMPUTE_CAPABILITIES) <= set(RTX_SUPPORTED) and "9.0" not in RTX_SUPPORTED


def test_build_engines_says_when_the_hosts_gpu_is_not_a_target(tiny_bundle, tmp_path, capsys, monkeypatch):
    """An H200 (9.0) host: the engines build, and the builder is told they will not run there."""
    from mmtrt.backends.tensorrt import build

    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    monkeypatch.setattr(build, "gpu_capability", lambda: "9.0")
    assert main(["build-engines", str(bundle), "--target", "rtx", "--segment", "vision.0"]) == 0
    out = capsys.readouterr().out
    assert "compute capability 9.0: Hopper: H100, H200) is not among the TensorRT-RTX engines' targets" in out
    assert "runs on GPUs of compute capability 8.0 (Ampere: A100, A30), 8.6" in describe(bundle)
    monkeypatch.setattr(build, "gpu_capability", lambda: "8.6")
    assert main(["build-engines", str(bundle), "--target", "rtx", "--segment", "vision.0", "--force"]) == 0
    assert "not among" not in capsys.readouterr().out
