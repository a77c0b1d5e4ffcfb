"""The static KV cache's TensorRT form (TensorScatter + Attention, mmtrt.backends.tensorrt.kv_cache_form) computes
what the GroupQueryAttention form computes, run by ONNX Runtime on the CPU over buffers bound in place, and what the
hf bundle's growing cache computes; placement puts the whole form on TensorRT and says so. TensorRT itself cannot
run here: that its parser takes the form is the operator table's verdict (mmtrt.backends.tensorrt.support)."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from builders import StaticCacheForm
from mmtrt.backends.tensorrt.kv_cache_form import tensorrt_form
from mmtrt.bundle.inspect import describe_placement


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def static(tiny_static_bundle):
    manifest = json.loads((tiny_static_bundle / "manifest.json").read_text())
    return onnx.load(tiny_static_bundle / "llm.onnx"), manifest


def grown_logits(hf_model, embeds_per_step):
    """The hf bundle's graph: past concatenated with the new keys, a fresh array every step."""
    sess, past, out = session(hf_model), None, []
    for embeds in embeds_per_step:
        batch, seq = embeds.shape[:2]
        if past is None:
            shape = [d.dim_value or 0 for d in next(i for i in hf_model.graph.input
                                                      if i.name == "past.0.key").type.tensor_type.shape.dim]
            past = {i.name: np.zeros((batch, shape[1], 0, shape[3]), np.float32)
                    for i in sess.get_inputs() if i.name.startswith("past.")}
        length = next(iter(past.values())).shape[2]
        result = sess.run(None, {"inputs_embeds": embeds, "attention_mask": np.ones((batch, length + seq), np.int64),
                                 "position_ids": np.tile(np.arange(length, length + seq), (batch, 1)),
                                 "logits_from": np.zeros(1, np.int64), **past})
        named = dict(zip([o.name for o in sess.get_outputs()], result))
        past = {k.replace("present.", "past."): v for k, v in named.items() if k.startswith("present.")}
        out.append(named["logits"])
    return out


@pytest.mark.parametrize("batch, steps", [(1, [9, 1, 1, 4, 1, 1]), (3, [6, 1, 1, 1])])
def test_the_tensorrt_form_computes_the_gqa_form_and_the_grown_cache(static, tiny_bundle, batch, steps, rng):
    model, manifest = static
    llm, capacity = manifest["model"]["llm"], manifest["dims"]["capacity"]["max"]
    gqa, trt = StaticCacheForm(model, llm, capacity, batch), StaticCacheForm(tensorrt_form(model), llm, capacity, batch)
    hidden = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    embeds = [rng.standard_normal((batch, seq, hidden)).astype(np.float32) for seq in steps]
    grown = grown_logits(onnx.load(tiny_bundle / "llm.onnx"), embeds)
    for step, (e, reference) in enumerate(zip(embeds, grown)):
        ours, theirs = trt.step(e), gqa.step(e)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5, err_msg=f"step {step}: against GQA")
        np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5, err_msg=f"step {step}: against hf")
    held = int(trt.lengths[0])
    for name in gqa.cache:  # the rows each form wrote in place (the layers before differ by float rounding), no more
        np.testing.assert_allclose(trt.cache[name][:, :, :held], gqa.cache[name][:, :, :held], rtol=1e-4, atol=1e-5)
        assert not trt.cache[name][:, :, held:].any()


def test_the_form_has_no_contrib_op_and_one_update_and_attention_per_layer(static):
    model, manifest = static
    form = tensorrt_form(model)
    ops = [n.op_type for n in form.graph.node]
    layers = manifest["model"]["llm"]["num_layers"]
    assert ops.count("TensorScatter") == 2 * layers and ops.count("Attention") == layers
    assert not [n for n in form.graph.node if n.domain == "com.microsoft"]
    outputs = {o.name for o in form.graph.output}
    assert {f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")} <= outputs
    onnx.checker.check_model(form)


def test_placement_puts_the_whole_form_on_tensorrt_and_says_which_form_runs_where(static, tiny_static_bundle):
    _, manifest = static
    llm = manifest["placement"]["llm"]
    assert [s["backend"] for s in llm["segments"]] == ["tensorrt"]
    assert not [n for n in llm["nodes"] if n["backend"] != "tensorrt"]
    assert set(llm["kv_cache_forms"]) == {"tensorrt", "onnxruntime"}
    entry = next(e for e in manifest["tensorrt"]["segments"] if e["id"] == llm["segments"][0]["id"])
    assert entry["profiles"] is not None, entry.get("unbuildable")  # the shape plan covers the mask and buffers
    segment = onnx.load(tiny_static_bundle / llm["segments"][0]["onnx"], load_external_data=False)
    assert "TensorScatter" in {n.op_type for n in segment.graph.node}
    text = describe_placement(tiny_static_bundle)
    assert "KV cache on tensorrt: TensorScatter (IKVCacheUpdateLayer" in text
    assert "KV cache on onnxruntime: com.microsoft.GroupQueryAttention" in text
