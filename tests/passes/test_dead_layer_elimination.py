"""dead_layer_elimination removes exactly the layers after the feature layer, and nothing it must keep."""

import numpy as np
import onnxruntime as ort
from onnx import helper

from builders import make_model, tensor
from mmtrt.ir.flops import count_flops
from mmtrt.ir.frontend import lower
from passes.cleanup.dead_layer_elimination import DeadLayerElimination


def run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def stacked_layers(select_axis=0, index=1):
    """x -> three MatMul 'layers'; their outputs stacked on axis 0 and one selected, like the lowered tower."""
    rng = np.random.default_rng()
    weights = [(f"w{i}", rng.normal(size=(4, 4)).astype(np.float32)) for i in range(3)]
    nodes, prev, stacked = [], "x", []
    for i in range(3):
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("Unsqueeze", [f"h{i}", "zero"], [f"u{i}"]))
        prev = f"h{i}"
        stacked.append(f"u{i}")
    nodes.append(helper.make_node("Concat", stacked, ["stack"], axis=0))
    nodes.append(helper.make_node("Gather", ["stack", "idx"], ["y"], axis=select_axis))
    inits = [*weights, ("zero", np.array([0], np.int64)), ("idx", np.array(index, np.int64))]
    return make_model(nodes, [tensor("x", [2, 4])], [tensor("y", None)], inits)


class FakeIR:
    def __init__(self, model):
        from mmtrt.ir.graph import Component

        self.components = {"vision": Component("vision", [], [], onnx=model)}


def test_layers_after_the_selected_one_are_removed_and_output_is_unchanged():
    model = stacked_layers(index=1)
    x = np.random.default_rng().normal(size=(2, 4)).astype(np.float32)
    before = run(model, {"x": x})[0]
    ir = FakeIR(model)
    report = DeadLayerElimination(DeadLayerElimination.Config()).run(ir)
    after_model = ir.components["vision"].onnx
    assert np.array_equal(run(after_model, {"x": x})[0], before)
    assert [n.op_type for n in after_model.graph.node] == ["MatMul", "MatMul", "Identity"]
    assert report["selects_bypassed"] == 1
    assert report["flops_per_image_after"] == 2 * report["flops_per_image_before"] // 3


def test_select_on_another_axis_is_left_alone():
    model = stacked_layers(select_axis=1)
    ir = FakeIR(model)
    report = DeadLayerElimination(DeadLayerElimination.Config()).run(ir)
    assert report["selects_bypassed"] == 0
    assert len(ir.components["vision"].onnx.graph.node) == len(model.graph.node)


def test_tiny_llava_loses_its_last_encoder_layer_bit_exactly(tiny):
    model, processor = tiny
    ir = lower(model, processor)
    vision = ir.components["vision"]
    pixels = np.random.default_rng().normal(size=(2, *vision.inputs[0].shape[1:])).astype(np.float32)
    before = run(vision.onnx, {"pixel_values": pixels})[0]
    report = DeadLayerElimination(DeadLayerElimination.Config()).run(ir)
    assert np.array_equal(run(ir.components["vision"].onnx, {"pixel_values": pixels})[0], before)
    layers = model.config.vision_config.num_hidden_layers
    assert report["layers_removed"] == 1 and report["encoder_layers_kept"] == layers - 1
    assert report["flops_per_image_after"] == count_flops(ir.components["vision"].onnx, {"num_images": 1})
    assert 0 < report["flops_saved_pct"] < 100 / layers
