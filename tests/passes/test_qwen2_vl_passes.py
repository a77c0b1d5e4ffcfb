"""Weight passes on Qwen2-VL and Qwen2.5-VL, each against transformers: awq_int4's calibration feeds are what
transformers computes for the same digit (the processor's patches, the tower's features in place, get_rope_index's
three rows of positions); the quantized LLM and vision tower equal their PyTorch twins carrying the graph's
dequantized weights (M-RoPE positions through the LLM, transformers' own vision forward); what the family cannot
give is refused at plan time in one line (a TensorRT-LLM checkpoint, Fisher sensitivity)."""

import copy
import json

import numpy as np
import onnx
import pytest
import torch

from builders import dequantized_linears, fake_quantized
from conftest import QWEN_FAMILIES
from mmtrt.compiler import make_plan
from mmtrt.errors import UserError
from mmtrt.eval import digits
from mmtrt.quant.calibration import calibration_batches
from mmtrt.runtime import load
from mmtrt.runtime.qwen2_vl import QwenImages, mrope_positions
from mmtrt.zoo.tiny_qwen2_vl import build_tiny_qwen2_vl

AWQ = ("passes:\n  - awq_int4: {group_size: 32, accuracy_level: 0, components: [llm, vision], "
       "calibration: {samples: 2, text_windows: 1}}\n")
LLM_LINEARS = 2 * 7 + 1  # two layers of q, k, v, o, gate, up, down; the lm_head


def report(bundle, name):
    return next(r for r in json.loads((bundle / "manifest.json").read_text())["passes"] if r["pass"] == name)


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_calibration_feeds_are_what_transformers_computes(qwen_compile, qwen_bundle, family):
    qwen_bundle(family)  # lowers the family once
    ir = copy.deepcopy(qwen_compile.lowered[family])
    batches = calibration_batches(ir, "digits", 1, 0)
    model, processor = build_tiny_qwen2_vl(family)
    image = digits.samples("train", 1, page=digits.SIDE)[0][0]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": digits.PROMPT}]}]
    inputs = processor(images=image, text=processor.apply_chat_template(messages, add_generation_prompt=True),
                       return_tensors="pt")
    ids, grid = inputs["input_ids"], inputs["image_grid_thw"]
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
        embeds[ids == model.config.image_token_id] = model.model.get_image_features(
            inputs["pixel_values"], grid).pooler_output[0]
        positions, _ = model.model.get_rope_index(ids, (ids == model.config.image_token_id).int(), grid)
    (vision,), (llm,) = batches.vision, batches.llm
    assert np.array_equal(vision["pixel_values"], inputs["pixel_values"].numpy())
    assert np.array_equal(llm["position_ids"], positions.numpy())
    np.testing.assert_allclose(llm["inputs_embeds"], embeds.numpy(), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module", params=QWEN_FAMILIES)
def awq(request, qwen_compile):
    model, _ = build_tiny_qwen2_vl(request.param)
    return model, qwen_compile(request.param, AWQ, f"{request.param}-awq.bundle")


def test_awq_int4_llm_equals_its_dequantized_twin_under_mrope_positions(awq, rng):
    model, bundle = awq
    changes = report(bundle, "awq_int4")["changes"]
    assert changes["llm"]["linears_quantized"] == LLM_LINEARS and changes["llm"]["groups_below_rtn"] > 0
    assert changes["trtllm_checkpoint"]["written"] is False and "MropeParams" in changes["trtllm_checkpoint"]["reason"]
    twin = fake_quantized(model, onnx.load(bundle / "llm.onnx"), LLM_LINEARS)
    pipe = load(bundle)
    ids = [5, 6] + [model.config.image_token_id] * 6 + [7, 8, 9]  # a 4 x 6 patch grid
    positions = mrope_positions(ids, model.config.image_token_id, [(1, 4, 6)], 2)[0][:, None]
    embeds = rng.normal(size=(1, len(ids), model.config.text_config.hidden_size)).astype(np.float32)
    logits, _ = pipe.step(embeds, pipe.empty_cache(), positions)
    with torch.no_grad():
        hidden = twin.model.language_model(inputs_embeds=torch.from_numpy(embeds),
                                           position_ids=torch.from_numpy(positions)).last_hidden_state
        expected = twin.lm_head(hidden).numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def vision_twin(source, model: onnx.ModelProto):
    """`source` with every vision linear set to the graph's dequantized weight (its pre-quant scale folded in)
    and every norm to the graph's (scale-folded) weight and bias; graph and modules are matched in order."""
    twin = copy.deepcopy(source)
    visual = twin.model.visual
    modules = [m for m in visual.modules() if isinstance(m, torch.nn.Linear)]
    norms = [m for m in visual.modules() if isinstance(m, torch.nn.LayerNorm) or type(m).__name__.endswith("RMSNorm")]
    graph = model.graph
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    norm_nodes = [n for n in graph.node if n.op_type in ("LayerNormalization", "RMSNormalization")]
    assert len(norm_nodes) == len(norms)
    linears = [v for k, v in dequantized_linears(model).items() if k.startswith("vision.")]
    assert len(linears) == len(modules)
    for module, (w, x) in zip(modules, linears):
        assert w.shape == tuple(module.weight.shape)
        module.weight.data = torch.from_numpy(np.ascontiguousarray(w, np.float32))
        if x in producer and producer[x] in norm_nodes:
            norm = norms[norm_nodes.index(producer[x])]
            norm.weight.data = torch.from_numpy(inits[producer[x].input[1]].copy())
            if len(producer[x].input) > 2 and producer[x].input[2]:
                norm.bias.data = torch.from_numpy(inits[producer[x].input[2]].copy())
    return twin


def test_awq_int4_vision_tower_equals_its_dequantized_twin(awq, rng):
    """transformers' own vision forward (its rotary, window split and merger) with the graph's weights."""
    model, bundle = awq
    changes = report(bundle, "awq_int4")["changes"]["vision"]
    assert changes["linears_quantized"] == sum(isinstance(m, torch.nn.Linear) for m in model.model.visual.modules())
    twin = vision_twin(model, onnx.load(bundle / "vision.onnx"))
    pipe = load(bundle)
    images = QwenImages(pipe.manifest, pipe.preprocess_spec)
    patches = images.pixels(digits.digit_image(rng.integers(0, 17, (8, 8)), 112).resize((140, 84)))
    got = pipe.runners["vision"].run(images.vision_feeds(patches))["image_features"][0]
    with torch.no_grad():
        expected = twin.model.get_image_features(torch.from_numpy(patches.values),
                                                 torch.tensor([patches.grid])).pooler_output[0].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("entry, message", [
    ("awq_int4: {trtllm_checkpoint: always}", "trtllm_checkpoint: always: TensorRT-LLM builds Qwen2-VL's LLM"),
    ("awq_int4: {sensitivity: fisher, float_budget_mib: 0.01}", "takes three rows from each image's grid"),
])
def test_what_awq_int4_cannot_give_is_refused_at_plan_time(qwen_checkpoints, tmp_path, entry, message):
    (tmp_path / "checkpoint").symlink_to(qwen_checkpoints["qwen2_vl"], target_is_directory=True)
    (tmp_path / "recipe.yaml").write_text(f"model: {{source: hf, path: checkpoint}}\npasses:\n  - {entry}\n")
    with pytest.raises(UserError, match=message) as info:
        make_plan(tmp_path / "recipe.yaml")
    assert "\n" not in str(info.value)
