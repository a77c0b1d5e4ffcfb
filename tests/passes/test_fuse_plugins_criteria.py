"""fuse_plugins on token_prune's own output for every criterion, fixed and dynamic, on the tiny LLaVA's tower: each
selection becomes one plugin node (TokenSelect where it scores [CLS] attention itself, TokenSelectScored or
TokenSelectDynamic fed the graph's scores otherwise), the fused graph run by ONNX Runtime through the plugin's
function equals the unfused pass's output, and the kernel's CPU twin on the plugin's inputs equals it too."""

import copy
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from builders import make_model, tensor
from mmtrt.ir.frontend import lower
from mmtrt.ir.graph import Component
from mmtrt.kernels import cpu
from passes.fusion.fuse_plugins import FusePlugins, FusePluginsConfig
from passes.precision.cast_precision import CastPrecision, CastPrecisionConfig
from passes.vision import token_criteria as tc
from passes.vision import token_prune as tp
from token_prune_graphs import channel_mean_saliency, prune, run

CRITERIA = ["cls_attention", "norm", "random", "attention_entropy", "saliency"]
FIXED = {"keep": 20}
DYNAMIC = {"budget": "dynamic", "mass": 0.6, "min": 4, "max": 40}
STANDARD_SELECTION = {"TopK", "GatherND", "CumSum", "Where"}


@pytest.fixture(scope="module")
def clip_ir(tiny):
    return lower(*tiny)


def component(model):
    comp = Component.__new__(Component)
    comp.name, comp.onnx = "vision", model
    comp.metadata = {"placement": {"targeted": True, "min_segment_size": 1}}
    return comp


def fuse(model):
    comp = component(model)
    report = FusePlugins(FusePluginsConfig(plugins=["token_select"])).run(SimpleNamespace(components={"vision": comp}))
    onnx.checker.check_model(comp.onnx, full_check=True)
    return comp.onnx, report["vision"]


def pruned(clip_ir, method, budget, tmp_path):
    ir = copy.deepcopy(clip_ir)
    extra = {"saliency_model": channel_mean_saliency(tmp_path / "saliency.onnx")} if method == "saliency" else {}
    prune(ir, method=method, **budget, **extra)
    return ir.components["vision"].onnx


def squares(rng, counts=(2, 6, 12)):
    """Bright 8 x 8-pixel patches on noise, a different number per image (salient where bright)."""
    pixels = 0.1 * rng.normal(size=(len(counts), 3, 64, 64)).astype(np.float32)
    for image, count in enumerate(counts):
        for patch in rng.choice(64, count, replace=False):
            pixels[image, :, 8 * (patch // 8):8 * (patch // 8 + 1), 8 * (patch % 8):8 * (patch % 8 + 1)] += 3
    return pixels


def expected_plugin(method, budget):
    if budget is DYNAMIC:
        return "TokenSelectDynamic"
    return "TokenSelect" if method == "cls_attention" else "TokenSelectScored"


@pytest.mark.parametrize("budget", [FIXED, DYNAMIC], ids=["fixed", "dynamic"])
@pytest.mark.parametrize("method", CRITERIA)
def test_every_criterion_fuses_and_runs_as_the_unfused_pass(clip_ir, method, budget, rng, tmp_path):
    model = pruned(clip_ir, method, budget, tmp_path)
    feeds = {"pixel_values": squares(rng)}
    before = run(model, feeds)
    fused, report = fuse(copy.deepcopy(model))
    name = expected_plugin(method, budget)
    assert report["fused"] == {f"mmtrt::{name}": 1}, report
    assert not STANDARD_SELECTION & {n.op_type for n in fused.graph.node}
    plugin = next(n for n in fused.graph.node if n.domain == "mmtrt")
    assert plugin.op_type == name
    after = run(fused, feeds, list(plugin.input) + [plugin.output[0]])
    for ours, theirs in zip(after, before):
        np.testing.assert_array_equal(ours, theirs)
    if name == "TokenSelect":
        return  # scored inside the kernel: tests/passes/test_fuse_plugins.py holds its twin to the graph
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in plugin.attribute}
    scores, features, block = after[len(before):]
    if name == "TokenSelectDynamic":
        twin, counts, _ = cpu.token_select_scored(scores, features, attrs["most"], attrs["least"], attrs["mass"])
        np.testing.assert_array_equal(counts, after[1])
        assert (attrs["most"], attrs["least"]) == (40, 4) and np.isclose(attrs["mass"], 0.6)
    else:
        twin, _, _ = cpu.token_select_scored(scores, features, attrs["keep"])
    np.testing.assert_array_equal(twin, block)


def test_dynamic_counts_differ_from_image_to_image(clip_ir, rng, tmp_path):
    """The case the plugin's count is for: the fused saliency selection keeps more tokens where more is bright."""
    model = pruned(clip_ir, "saliency", {**DYNAMIC, "mass": 0.9}, tmp_path)
    fused, _ = fuse(copy.deepcopy(model))
    pixels = squares(rng, (5, 9, 14))
    counts = run(fused, {"pixel_values": pixels})[1]
    assert 4 <= counts[0] < counts[1] < counts[2] <= 40
    np.testing.assert_array_equal(counts, run(model, {"pixel_values": pixels})[1])


def test_a_dynamic_selection_whose_order_is_read_elsewhere_is_left_alone(clip_ir, tmp_path):
    model = pruned(clip_ir, "norm", DYNAMIC, tmp_path)
    order = next(n for n in model.graph.node if n.op_type == "TopK").output[1]
    model.graph.node.append(onnx.helper.make_node("Identity", [order], ["order_out"]))
    model.graph.output.append(onnx.helper.make_tensor_value_info("order_out", onnx.TensorProto.INT64, [None, 64]))
    fused, report = fuse(model)
    assert report["fused"] == {} and any("read elsewhere" in why for why in report["not_fused"])
    assert not any(n.domain == "mmtrt" for n in fused.graph.node)


def test_a_dynamic_selection_after_cast_precision_fuses_and_counts_in_fp32(rng):
    """cast_precision ranks and compares in fp16 (casts inside the count's arithmetic) and stores the mass in fp16
    (0.7 becomes 0.7001953125); the fused node reads the fp32 scores before the casts and counts in fp32 at that
    mass: the unfused fp32 selection at the stored mass, exactly. (Compared with a mass of 0.7, one image in about
    thirty has a prefix whose share of the scores lies between the two and keeps one token more.)"""
    tokens, most, dim = 30, 12, 4

    def selection(mass: float) -> onnx.ModelProto:
        model = make_model([], [tensor("scores", ["n", tokens]), tensor("features", ["n", tokens, dim])],
                           [tensor("block", ["n", most, dim]), onnx.helper.make_tensor_value_info("count", 7, ["n"])])
        block, count = tp._select_dynamic(tc.Builder(model.graph), "features", "scores",
                                          tp.Budget(tokens, most, 0, 0, 0, False, mass, 2))
        model.graph.node.extend([onnx.helper.make_node("Identity", [block], ["block"]),
                                 onnx.helper.make_node("Identity", [count], ["count"])])
        return model

    feeds = {"scores": rng.random((4, tokens), dtype=np.float32) ** 3,
             "features": rng.normal(size=(4, tokens, dim)).astype(np.float32)}
    reference = run(selection(float(np.float16(0.7))), feeds)
    comp = component(selection(0.7))
    CastPrecision(CastPrecisionConfig(dtype="fp16"))._lower(comp)
    assert any(n.op_type == "Cast" and n.output[0].startswith("token_prune/CumSum") for n in comp.onnx.graph.node)
    fused, report = fuse(comp.onnx)
    assert report["fused"] == {"mmtrt::TokenSelectDynamic": 1}
    for ours, theirs in zip(run(fused, feeds), reference):
        np.testing.assert_array_equal(ours, theirs)
