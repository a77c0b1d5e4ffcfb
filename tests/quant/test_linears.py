"""Linears, groups, modules and absorbers found in the exported tiny LLaVA, and the cases that must not match."""

import numpy as np
import onnx
from onnx import helper

from builders import make_model, tensor
from mmtrt.quant.linears import find_linears, region_inputs

LAYER = ("q_proj+k_proj+v_proj", "o_proj", "gate_proj+up_proj", "down_proj")


def test_llm_groups_roles_and_absorbers(tiny_bundle):
    model = onnx.load(tiny_bundle / "llm.onnx")
    index, linears, groups = find_linears(model, "llm")
    names = [g.name for g in groups]
    assert names == [f"llm.layers.{i}.{g}" for i in range(4) for g in LAYER] + ["llm.lm_head"]
    by_name = {g.name: g for g in groups}
    for i in range(4):
        qkv, o, mlp, down = (by_name[f"llm.layers.{i}.{g}"] for g in LAYER)
        assert qkv.absorber[0] == "norm" and qkv.absorber[1].op_type == "RMSNormalization"
        assert mlp.absorber[0] == "norm"
        assert down.absorber == ("linear", next(lin for lin in mlp.linears if lin.role == "up_proj"))
        assert o.absorber is None  # grouped-query attention: v_proj cannot take o_proj's scale
        assert qkv.downstream is o.linears[0] and mlp.downstream is down.linears[0]
        assert o.module_output is None and down.module_output is None and not o.region
        inputs = region_inputs(index, qkv)
        assert inputs[0] == qkv.input and f"past.{i}.key" in inputs and f"past.{i}.value" in inputs
        assert not {lin.weight for lin in qkv.linears} & set(inputs)
    assert by_name["llm.lm_head"].linears[0].output == "logits" and by_name["llm.lm_head"].absorber[0] == "norm"
    assert len(linears) == 29


def test_vision_groups(tiny_bundle):
    _, linears, groups = find_linears(onnx.load(tiny_bundle / "vision.onnx"), "vision")
    roles = [lin.role for lin in linears]
    assert roles[:6] == ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"] and roles[-2:] == [None, None]
    fc1 = next(g for g in groups if g.linears[0].role == "fc1")
    assert fc1.absorber[1].op_type == "LayerNormalization" and fc1.downstream.role == "fc2"
    fc2 = next(g for g in groups if g.linears[0].role == "fc2")
    assert fc2.absorber is None  # GELU between fc1 and fc2: nothing linear can take the scale


def _two_linears(rng, extra_reader: bool):
    """x -> RMSNorm -> (MatMul a, MatMul b) -> Mul -> MatMul c, optionally with a Relu also reading the norm."""
    w = {n: rng.normal(size=shape).astype(np.float32) for n, shape in
         (("wa", (8, 8)), ("wb", (8, 8)), ("wc", (8, 8)), ("g", (8,)))}
    nodes = [helper.make_node("RMSNormalization", ["x", "g"], ["h"], axis=-1),
             helper.make_node("MatMul", ["h", "wa"], ["a"]), helper.make_node("MatMul", ["h", "wb"], ["b"]),
             helper.make_node("Mul", ["a", "b"], ["ab"]), helper.make_node("MatMul", ["ab", "wc"], ["y"])]
    outputs = [tensor("y", [2, 8])]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["h"], ["r"]))
        outputs.append(tensor("r", [2, 8]))
    return make_model(nodes, [tensor("x", [2, 8])], outputs, w.items())


def test_absorbers_need_exclusive_readers(rng):
    _, _, groups = find_linears(_two_linears(rng, extra_reader=False), "llm")
    ab, c = groups
    assert ab.absorber[0] == "norm" and ab.module_output == "y"
    assert c.absorber[0] == "linear" and c.absorber[1].output == "a"  # the first factor made by a linear alone
    _, _, groups = find_linears(_two_linears(rng, extra_reader=True), "llm")
    assert groups[0].absorber is None  # the Relu reads the norm's output too: folding would change it


def test_residual_add_ends_a_module(rng):
    """x -> MatMul -> Add(residual x) -> MatMul: the second linear is past the residual join, not in a module."""
    w1, w2 = (rng.normal(size=(8, 8)).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Add", ["x", "a"], ["s"]),
             helper.make_node("MatMul", ["s", "w2"], ["y"])]
    _, _, groups = find_linears(make_model(nodes, [tensor("x", [2, 8])], [tensor("y", [2, 8])],
                                           [("w1", w1), ("w2", w2)]), "llm")
    assert groups[0].module_output is None and groups[0].absorber is None
