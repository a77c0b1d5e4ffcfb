"""The calibration images' features, computed one vision layer at a time, equal one session on the whole vision
graph for every family (fixed-size, any-resolution tiles, native-resolution patches with their indices), on fresh
random images; the stage sessions hold every linear's weight once between them, each at most one layer's MLP, and
none computes the LLaVA export's stack of every hidden state."""

import copy

import numpy as np
import pytest

import mmtrt.compiler
from builders import random_image
from mmtrt.ir.frontend import fit_envelope
from mmtrt.ir.hidden_states import stacked_selects
from mmtrt.ir.rewrite import producers
from mmtrt.quant import calibration_images, layerwise
from mmtrt.quant.linears import find_linears
from mmtrt.partition.placement import annotate
from mmtrt.quant.session import session
from mmtrt.recipe import Envelope, PartitionPolicy
from passes.quant.int8_weights import Int8Weights


@pytest.fixture(scope="module")
def lowered(tiny, anyres_compile, onevision_bundle, qwen_compile, qwen_bundle):
    """family -> its lowered IR (the tiny LLaVA lowered here, the others from the session's compiles)."""
    qwen_bundle("qwen2_vl")
    return {"llava": mmtrt.compiler.lower(*tiny), "llava_onevision": anyres_compile.lowered["llava_onevision"],
            "qwen2_vl": qwen_compile.lowered["qwen2_vl"]}


@pytest.mark.parametrize("family", ["llava", "llava_onevision", "qwen2_vl"])
def test_features_a_layer_at_a_time_equal_the_whole_graphs(lowered, rng, monkeypatch, family):
    ir = copy.deepcopy(lowered[family])
    vision = ir.components["vision"].onnx
    images = [random_image(rng, int(rng.integers(40, 130)), int(rng.integers(40, 130))) for _ in range(3)]
    held, computed, made = [], set(), layerwise.session

    def recorded(model):
        held.append({t.name for t in model.graph.initializer})
        computed.update(out for node in model.graph.node for out in node.output)
        return made(model)
    monkeypatch.setattr(layerwise, "session", recorded)
    got = calibration_images.encoded(ir, images)

    linears = find_linears(vision, "vision")[1]
    weights, down = {lin.weight for lin in linears}, {lin.weight for lin in linears if lin.n < lin.k}
    assert len(held) == len(down) + 1 and len(down) >= 2
    assert sorted(w for names in held for w in names & weights) == sorted(weights)
    assert all(len(names & down) <= 1 for names in held)
    stacks = {producers(vision.graph)[out].input[0] for out in stacked_selects(vision.graph)}
    assert len(stacks) == (family != "qwen2_vl") and not stacks & computed
    prepare, features = calibration_images._encoder(ir)
    whole = session(vision)
    names = [o.name for o in whole.get_outputs()]
    for image, (inputs, feats, grid) in zip(images, got):
        feeds, kept, expected_grid = prepare(image)
        expected = features(dict(zip(names, whole.run(None, feeds))), image)
        assert feats.shape == expected.shape and grid == expected_grid and len(inputs) == len(kept)
        np.testing.assert_allclose(feats, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activations, op", [("dynamic", "DynamicQuantizeMatMul"), ("float", "DequantizeLinear")])
def test_an_int8_tower_is_cut_at_the_same_layers(lowered, rng, monkeypatch, activations, op):
    """After int8_weights (DynamicQuantizeMatMul in place of MatMul, or a MatMul of a dequantized weight) a later
    calibrated pass still runs the tower a layer at a time, not in one session over the stack of every hidden
    state, and gets the int8 graph's features."""
    ir = copy.deepcopy(lowered["llava"])
    down = [lin for lin in find_linears(ir.components["vision"].onnx, "vision")[1] if lin.n < lin.k]
    ir.config = fit_envelope(ir.config, Envelope())
    annotate(ir, PartitionPolicy())
    Int8Weights(Int8Weights.Config(components=["vision"], activations=activations)).run(ir)
    vision = ir.components["vision"].onnx
    assert op in {node.op_type for node in vision.graph.node}
    images = [random_image(rng, int(rng.integers(40, 130)), int(rng.integers(40, 130))) for _ in range(2)]
    computed, sessions, made = set(), [], layerwise.session

    def recorded(model):
        sessions.append(model)
        computed.update(out for node in model.graph.node for out in node.output)
        return made(model)
    monkeypatch.setattr(layerwise, "session", recorded)
    got = calibration_images.encoded(ir, images)

    assert len(sessions) == len(down) + 1 and len(down) >= 2
    stacks = {producers(vision.graph)[out].input[0] for out in stacked_selects(vision.graph)}
    assert stacks and not stacks & computed
    prepare, features = calibration_images._encoder(ir)
    whole = session(vision)
    names = [o.name for o in whole.get_outputs()]
    for image, (_, feats, _) in zip(images, got):
        expected = features(dict(zip(names, whole.run(None, prepare(image)[0]))), image)
        np.testing.assert_allclose(feats, expected, rtol=1e-5, atol=1e-5)
