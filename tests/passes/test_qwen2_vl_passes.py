"""Weight passes on Qwen2-VL and Qwen2.5-VL, each against transformers: awq_int4's calibration feeds are what
transformers computes for the same digit (the processor's patches, the tower's features in place, get_rope_index's
three rows of positions); the quantized LLM and vision tower equal their PyTorch twins carrying the graph's
dequantized weights (M-RoPE positions through the LLM, transformers' own vision forward); what the family cannot
give is refused at plan time in one line (a TensorRT-LLM checkpoint of a scaled M-RoPE, Fisher sensitivity).

The TensorRT-LLM checkpoint of the LLM (float in the default bundle, W4A16_AWQ from awq_int4), read with json + a
hand-written safetensors parser and run as TensorRT-LLM's QWen decoder in numpy (tests/builders.py) with the rotary
cos/sin the TensorRT-LLM runner passes for M-RoPE positions, gives the ONNX graph's logits; its names, shapes and
config are those TensorRT-LLM's qwen model declares (transcribed below from tensorrt_llm/models/qwen/config.py and
model.py, tensorrt_llm/layers/attention.py and mlp.py: TensorRT-LLM is not installable where these tests run)."""

import copy
import json
import shutil

import numpy as np
import onnx
import pytest
import torch

from builders import (checkpoint_linear, declared_shapes, dequantized_linears, fake_quantized,
                      graph_logits_as_checkpoint, numpy_llama_logits, read_checkpoint, read_safetensors, w4a16_shapes)
from conftest import QWEN_FAMILIES, TRTLLM_OPT_IN
from mmtrt.handoff.trtllm_worker import engine_mrope
from mmtrt.compiler import make_plan
from mmtrt.errors import UserError
from mmtrt.eval import digits
from mmtrt.quant.calibration import calibration_batches
from mmtrt.runtime import load
from mmtrt.runtime.qwen2_vl import QwenImages, mrope_positions
from mmtrt.handoff.trtllm_runner import mrope_cos_sin
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
    assert changes["trtllm_checkpoint"] == {"written": False,  # a plain recipe asks for no TensorRT-LLM artifact
                                            "reason": "not requested (partition.llm does not list tensorrt-llm)"}
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


@pytest.mark.parametrize("entry, rope, message", [
    ("awq_int4: {trtllm_checkpoint: always}", {"rope_type": "linear", "factor": 2.0},
     r"trtllm_checkpoint: always: the LLM's M-RoPE is scaled \(rope_type linear\)"),
    ("awq_int4: {sensitivity: fisher, float_budget_mib: 0.01}", {}, "takes three rows from each image's grid"),
])
def test_what_awq_int4_cannot_give_is_refused_at_plan_time(qwen_checkpoints, tmp_path, entry, rope, message):
    shutil.copytree(qwen_checkpoints["qwen2_vl"], tmp_path / "checkpoint")
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    config["text_config"]["rope_parameters"].update(rope)
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps(config))
    (tmp_path / "recipe.yaml").write_text(f"model: {{source: hf, path: checkpoint}}\npasses:\n  - {entry}\n")
    with pytest.raises(UserError, match=message) as info:
        make_plan(tmp_path / "recipe.yaml")
    assert "\n" not in str(info.value)


TRTLLM_AWQ = "passes:\n  - awq_int4: {group_size: 64, calibration: {samples: 2, text_windows: 1}}\n" + TRTLLM_OPT_IN


@pytest.fixture(scope="module", params=[(f, w) for f in QWEN_FAMILIES for w in ("float", "awq")],
                ids=lambda p: "-".join(p))
def trtllm(request, qwen_compile):
    """((family, float or awq), the bundle) with its TensorRT-LLM checkpoint: float (a recipe that only opts in) or
    W4A16_AWQ."""
    family, which = request.param
    if which == "float":
        return request.param, qwen_compile(family, TRTLLM_OPT_IN, f"{family}-trtllm.bundle")
    return request.param, qwen_compile(family, TRTLLM_AWQ, f"{family}-trtllm-awq.bundle")


def test_trtllm_checkpoint_reproduces_onnx_logits_under_mrope(trtllm, rng):
    """A prompt with an image's tokens (a 4 x 6 patch grid) at random text ids around them; the numpy decoder gets
    the checkpoint's embedding rows and the cos/sin the runner computes from what the worker reads of the engine's
config (the checkpoint's), ONNX Runtime the same rows and position_ids."""
    _, bundle = trtllm
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["tensorrt_llm"]["checkpoint"] == "trtllm/checkpoint"
    assert manifest["tensorrt_llm"]["checkpoint_missing"] is None
    cfg, t = read_checkpoint(bundle / "trtllm" / "checkpoint")
    image = manifest["model"]["image_token_id"]
    ids = [*rng.integers(0, image, 3), *[image] * 6, *rng.integers(0, image, 4)]
    positions, _ = mrope_positions(ids, image, [(1, 4, 6)], manifest["model"]["vision"]["merge_size"])
    cos_sin = mrope_cos_sin(positions, engine_mrope(cfg)).reshape(-1, cfg["head_size"] // 2, 2)[: len(ids)]
    got = numpy_llama_logits(cfg, t, ids, checkpoint_linear(cfg, t), cos_sin)

    want = graph_logits_as_checkpoint(bundle, ids, t["transformer.vocab_embedding.weight"], positions[:, None])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def qwen_config(config) -> dict:
    """What QWenConfig.from_hugging_face sets for qwen_type qwen2_vl (tensorrt_llm/models/qwen/config.py), read from
    the decoder's config. The architecture is the one TensorRT-LLM's MODEL_MAP knows for Qwen2-VL's decoder, which
    Qwen2.5-VL shares."""
    text = config.text_config
    head = text.hidden_size // text.num_attention_heads
    return {"architecture": "Qwen2VLForConditionalGeneration", "qwen_type": "qwen2_vl",
            "num_hidden_layers": text.num_hidden_layers, "num_attention_heads": text.num_attention_heads,
            "hidden_size": text.hidden_size, "intermediate_size": text.intermediate_size,
            "num_key_value_heads": text.num_key_value_heads, "head_size": head, "vocab_size": text.vocab_size,
            "position_embedding_type": "mrope", "max_position_embeddings": text.max_position_embeddings,
            "rotary_embedding_dim": head, "hidden_act": text.hidden_act, "attn_bias": True, "mlp_bias": False,
            "rotary_base": text.rope_parameters["rope_theta"],
            "rotary_scaling": {"type": "mrope", "mrope_section": text.rope_parameters["mrope_section"]},
            "tie_word_embeddings": config.tie_word_embeddings}


def test_trtllm_checkpoint_is_what_tensorrt_llm_qwen_declares(trtllm):
    (family, which), bundle = trtllm
    folder = bundle / "trtllm" / "checkpoint"
    cfg = json.loads((folder / "config.json").read_text())
    model, _ = build_tiny_qwen2_vl(family)
    expected = qwen_config(model.config)
    assert {k: cfg[k] for k in expected} == expected
    assert np.float32(cfg["norm_epsilon"]) == np.float32(model.config.text_config.rms_norm_eps)
    tensors, dtypes = read_safetensors(folder / "rank0.safetensors")
    shapes = declared_shapes(cfg)
    if which == "awq":
        assert report(bundle, "awq_int4")["changes"]["trtllm_checkpoint"]["written"] is True
        assert cfg["quantization"] == {"quant_algo": "W4A16_AWQ", "group_size": 64, "has_zero_point": False,
                                       "pre_quant_scale": True}  # every linear quantized: no exclude_modules
        shapes = w4a16_shapes(shapes, 64)
        assert {dtypes[n] for n in tensors if n.endswith(".weight") and len(shapes[n]) == 2
                and n.startswith("transformer.layers.")} == {"I8"}
    else:
        assert cfg["quantization"] == {"quant_algo": None} and set(dtypes.values()) == {"F16"}
    assert {n: tuple(a.shape) for n, a in tensors.items()} == shapes
    q, k, v = (getattr(model.model.language_model.layers[0].self_attn, f"{r}_proj").bias.detach().numpy()
               for r in "qkv")
    np.testing.assert_array_equal(tensors["transformer.layers.0.attention.qkv.bias"],
                                  np.concatenate([q, k, v]).astype(np.float16))


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_runner_mrope_cos_sin_equals_transformers_rotary_embedding(family, rng):
    """The cos/sin the TensorRT-LLM runner passes for an image prompt's three rows of positions, at each token and
    frequency, equal transformers' M-RoPE cos/sin (each half of the head takes the same frequency)."""
    model, _ = build_tiny_qwen2_vl(family)
    text = model.config.text_config
    ids = [5, *[model.config.image_token_id] * 12, *rng.integers(0, 200, 6)]
    positions, _ = mrope_positions(ids, model.config.image_token_id, [(1, 6, 8)], 2)
    head = text.hidden_size // text.num_attention_heads
    mrope = {"head_size": head, "rotary_base": text.rope_parameters["rope_theta"], "mrope_section":
             text.rope_parameters["mrope_section"], "max_position_embeddings": text.max_position_embeddings}
    table = mrope_cos_sin(positions, mrope).reshape(text.max_position_embeddings, head // 2, 2)
    assert not table[len(ids):, :, 1].any() and (table[len(ids):, :, 0] == 1).all()  # past the prompt: position 0
    with torch.no_grad():
        cos, sin = model.model.language_model.rotary_emb(torch.zeros(1, len(ids), text.hidden_size),
                                                         torch.from_numpy(positions[:, None]))
    for i, want in enumerate((cos[0].numpy(), sin[0].numpy())):
        np.testing.assert_allclose(np.concatenate([table[: len(ids), :, i]] * 2, -1), want, rtol=0, atol=1e-6)


def test_an_mrope_llm_without_a_bias_on_every_q_k_v_gets_no_checkpoint(qwen_compile, qwen_bundle):
    """TensorRT-LLM's Qwen2-VL checkpoint has attn_bias on every layer's q, k and v: an LLM missing one is refused."""
    from mmtrt.handoff.trtllm_export import NotExportable, float_checkpoint

    qwen_bundle("qwen2_vl")  # lowers the family once
    ir = copy.deepcopy(qwen_compile.lowered["qwen2_vl"])
    graph = ir.components["llm"].onnx.graph
    add = next(n for n in graph.node if n.op_type == "Add" and "layers.1.self_attn.k_proj.bias" in n.input[1])
    for node in graph.node:
        node.input[:] = [add.input[0] if i == add.output[0] else i for i in node.input]
    graph.node.remove(add)
    with pytest.raises(NotExportable, match=r"biased linears are \[llm.layers.0.k_proj, llm.layers.0.q_proj, "
                                            r"llm.layers.0.v_proj ...\]; TensorRT-LLM's Qwen2-VL checkpoint"):
        float_checkpoint(ir, "float16")
