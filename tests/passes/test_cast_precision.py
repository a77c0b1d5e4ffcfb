"""cast_precision lowers TensorRT segments and keeps normalisations, residual sums, position arithmetic and INT4
dequantisation as they are; its error on ONNX Runtime against fp32 is measured on the tiny LLaVA."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from builders import make_model, tensor
from mmtrt.backends.onnxruntime_backend import session_options
from mmtrt.ir.graph import Component
from mmtrt.partition.placement import graph_facts
from passes.precision.cast_precision import CastPrecision

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16


class FakeIR:
    def __init__(self, models: dict, targeted: bool = True):
        self.components = {}
        for name in CastPrecision.components:
            model = models.get(name) or make_model([helper.make_node("Identity", ["a"], ["b"])],
                                                    [tensor("a", [1])], [tensor("b", [1])])
            comp = Component(name, [], [], onnx=model)
            comp.metadata["placement"] = {"targeted": targeted, "min_segment_size": 1}
            self.components[name] = comp


def block_model(rng):
    """A pre-norm block: LN, linear with bias, residual add, LN, a linear to the output, and a linear whose
    weight is INT4 behind a DequantizeLinear."""
    hidden = 16
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "beta"], ["n1"], axis=-1, name="ln1"),
        helper.make_node("MatMul", ["n1", "w1"], ["m1"], name="mm1"),
        helper.make_node("Add", ["m1", "b1"], ["m2"], name="bias"),
        helper.make_node("Add", ["x", "m2"], ["r"], name="residual"),
        helper.make_node("LayerNormalization", ["r", "g", "beta"], ["n2"], axis=-1, name="ln2"),
        helper.make_node("MatMul", ["n2", "w2"], ["y"], name="mm2"),
        helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"], axis=0, block_size=8, name="dq"),
        helper.make_node("MatMul", ["n2", "wd"], ["z"], name="mm3"),
    ]
    q = rng.integers(-8, 8, size=(hidden, 4))
    inits = [("g", rng.normal(1, 0.1, hidden).astype(np.float32)), ("beta", rng.normal(0, 0.1, hidden).astype(np.float32)),
             ("w1", rng.normal(0, 0.3, (hidden, hidden)).astype(np.float32)), ("b1", rng.normal(0, 0.1, hidden).astype(np.float32)),
             ("w2", rng.normal(0, 0.3, (hidden, 8)).astype(np.float32)),
             ("ws", rng.uniform(0.01, 0.05, (2, 4)).astype(np.float32))]
    model = make_model(nodes, [tensor("x", ["batch", hidden])], [tensor("y", ["batch", 8]), tensor("z", ["batch", 4])], inits)
    model.graph.initializer.append(helper.make_tensor("wq", TensorProto.INT4, [hidden, 4], q.ravel().tolist()))
    return model


def run(model, feeds):
    opts = session_options(None, True, exact_int4=True)
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def test_lowers_linears_and_keeps_norms_residuals_and_dequantize(rng):
    model = block_model(rng)
    original = onnx.ModelProto()
    original.CopyFrom(model)
    ir = FakeIR({"vision": model})
    changes = CastPrecision(CastPrecision.Config()).run(ir)["vision"]
    lowered = ir.components["vision"].onnx
    onnx.checker.check_model(lowered, full_check=True)
    types = graph_facts(lowered).types
    assert types["m1"] == F16 and types["m2"] == F16 and types["y__reduced"] == F16
    assert types["r"] == F32 and types["n1"] == F32 and types["n2"] == F32
    weights = {t.name: t.data_type for t in lowered.graph.initializer}
    assert weights["w1"] == F16 and weights["w2"] == F16 and weights["g"] == F32
    assert weights["wq"] == TensorProto.INT4 and weights["ws"] == F32
    dq = next(n for n in lowered.graph.node if n.op_type == "DequantizeLinear")
    assert list(dq.input) == ["wq", "ws"] and types["wd"] == F32
    assert changes["kept_fp32"] == {"LayerNormalization": 2, "residual add": 1}
    assert [o.type.tensor_type.elem_type for o in lowered.graph.output] == [F32, F32]
    x = rng.normal(size=(5, 16)).astype(np.float32)
    want, got = run(original, {"x": x}), run(lowered, {"x": x})
    for name in ("y", "z"):
        err = np.abs(got[name] - want[name]).max() / np.abs(want[name]).max()
        assert 0 < err < 5e-3, (name, err)


def test_components_without_tensorrt_are_left_alone(rng):
    model = block_model(rng)
    before = model.SerializeToString()
    ir = FakeIR({"vision": model}, targeted=False)
    changes = CastPrecision(CastPrecision.Config(dtype="bf16")).run(ir)["vision"]
    assert changes["nodes_lowered"] == 0 and changes["kept_fp32"] == {"onnxruntime segment": 7}
    assert ir.components["vision"].onnx.SerializeToString() == before


def emulate_bf16(model):
    """ONNX Runtime has no CPU kernels for bf16 MatMul, Add, ... (checked: NOT_IMPLEMENTED), so bf16 is measured
    by emulation: compute in fp32 and round every bf16 tensor through a Cast to bf16 and back, as TensorRT
    stores it (its bf16 GEMMs accumulate in fp32)."""
    from onnx import numpy_helper

    graph = model.graph
    for t in graph.initializer:
        if t.data_type == BF16:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
    bf16 = {name for name, dtype in graph_facts(model).types.items() if dtype == BF16}
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for k, out in enumerate(node.output):
            if out in bf16:
                node.output[k] = f"{out}__exact"
                if node.op_type == "Cast":
                    node.attribute[0].i = F32
                nodes += [helper.make_node("Cast", [f"{out}__exact"], [f"{out}__bf16"], to=BF16),
                          helper.make_node("Cast", [f"{out}__bf16"], [out], to=F32)]
    del graph.node[:]
    graph.node.extend(nodes)
    for v in graph.value_info:
        if v.type.tensor_type.elem_type == BF16:
            v.type.tensor_type.elem_type = F32
    return model


def lowered_tiny(tiny_bundle, dtype):
    models = {c: onnx.load(tiny_bundle / f"{c}.onnx") for c in ("vision", "llm")}
    ir = FakeIR({c: onnx.load(tiny_bundle / f"{c}.onnx") for c in ("vision", "llm")})
    for comp in ir.components.values():
        comp.metadata["placement"]["min_segment_size"] = 5
    CastPrecision(CastPrecision.Config(dtype=dtype)).run(ir)
    return models, {c: ir.components[c].onnx for c in models}


def llm_feeds(rng, hidden=128, layers=4, kv_heads=2, head_dim=32, past=20, seq=12):
    feeds = {"inputs_embeds": rng.normal(size=(1, seq, hidden)).astype(np.float32),
             "attention_mask": np.ones((1, past + seq), np.int64),
             "position_ids": np.arange(past, past + seq)[None], "logits_from": np.zeros(1, np.int64)}
    for i in range(layers):
        for kind in ("key", "value"):
            feeds[f"past.{i}.{kind}"] = rng.normal(size=(1, kv_heads, past, head_dim)).astype(np.float32)
    return feeds


def relative_errors(reference, candidate, rng):
    pixels = {"pixel_values": rng.normal(size=(2, 3, 64, 64)).astype(np.float32)}
    feeds = llm_feeds(rng)
    want_v, got_v = run(reference["vision"], pixels)["image_features"], run(candidate["vision"], pixels)["image_features"]
    want_l, got_l = run(reference["llm"], feeds)["logits"], run(candidate["llm"], feeds)["logits"]
    vision = np.abs(got_v - want_v).max() / np.abs(want_v).max()
    logits = np.abs(got_l - want_l).max() / np.abs(want_l).max()
    agree = (got_l.argmax(-1) == want_l.argmax(-1)).mean()
    return vision, logits, agree


def test_fp16_error_on_the_tiny_llava(tiny_bundle, rng):
    reference, lowered = lowered_tiny(tiny_bundle, "fp16")
    vision, logits, agree = relative_errors(reference, lowered, rng)
    print(f"fp16: vision max error / max |feature| {vision:.2e}, logits {logits:.2e}, argmax agreement {agree:.3f}")
    assert 0 < vision < 3e-3 and 0 < logits < 1e-2 and agree >= 0.75


def test_bf16_error_on_the_tiny_llava_emulated(tiny_bundle, rng):
    reference, lowered = lowered_tiny(tiny_bundle, "bf16")
    vision, logits, agree = relative_errors(reference, {c: emulate_bf16(m) for c, m in lowered.items()}, rng)
    print(f"bf16 (emulated): vision {vision:.2e}, logits {logits:.2e}, argmax agreement {agree:.3f}")
    assert 0 < vision < 2e-2 and 0 < logits < 6e-2 and agree >= 0.5
