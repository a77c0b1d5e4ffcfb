"""The passes on any-resolution models: token_prune per tile, channel_prune on the vision MLP, awq_int4 on a biased
Qwen2 LLM, cast_precision, the paged KV layout; each against PyTorch. What a pass cannot follow is refused at plan
time: recover (one fixed-size image per prompt), max_tiles on a fixed-size model.

LLaVA-OneVision's Qwen2 LLM as a TensorRT-LLM checkpoint (float in the default bundle, W4A16_AWQ from awq_int4),
read back and run as TensorRT-LLM's QWen decoder in numpy with plain RoPE (tests/builders.py), gives the ONNX graph's
logits; its config is what QWenConfig.from_hugging_face makes for qwen_type qwen2 and its names and shapes those
QWenForCausalLM declares (transcribed from tensorrt_llm/models/qwen/config.py and model.py: TensorRT-LLM is not
installable where these tests run)."""

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
import transformers

from builders import (assert_same_up_to_near_ties, checkpoint_linear, declared_shapes, fake_quantized,
                      graph_logits_as_checkpoint, numpy_llama_logits, random_image, read_checkpoint, read_safetensors,
                      w4a16_shapes)
from conftest import TRTLLM_OPT_IN, compile_to
from mmtrt.handoff.trtllm_worker import engine_mrope
from mmtrt.preprocess.anyres import grid_tiles
from mmtrt.compiler import make_plan
from mmtrt.errors import UserError
from mmtrt.ir.export import VisionWithProjector
from mmtrt.runtime import load

CLASSES = {"llava_next": transformers.LlavaNextForConditionalGeneration,
           "llava_onevision": transformers.LlavaOnevisionForConditionalGeneration}
CALIBRATION = "calibration: {samples: 2, text_windows: 1}"


@pytest.fixture(scope="module")
def sources(anyres_checkpoints):
    return {family: (CLASSES[family].from_pretrained(folder).eval(), transformers.AutoProcessor.from_pretrained(folder))
            for family, folder in anyres_checkpoints.items()}


def report(bundle, name):
    return next(r for r in json.loads((bundle / "manifest.json").read_text())["passes"] if r["pass"] == name)


def tiles(processor, image):
    return processor.image_processor(images=image, return_tensors="pt")["pixel_values"][0]


def test_token_prune_keeps_per_tile_and_lays_tiles_out_one_after_another(anyres_compile, sources, rng):
    """method norm, keep 5 of a tile's 16: PyTorch picks each tile's 5 largest-norm tokens before the projector."""
    bundle = anyres_compile("llava_next", "passes:\n  - token_prune: {keep: 5, method: norm}\n", "next-pruned.bundle")
    model, processor = sources["llava_next"]
    pipe = load(bundle)
    assert pipe.model["vision"]["anyres"]["layout"] == "tiles" and pipe.model["vision"]["image_tokens"] == 5 * 5
    tower = model.model.vision_tower
    for height, width in [(40, 90), (70, 30)]:
        image = random_image(rng, height, width)
        ids, features = pipe.encode_image(image, pipe.prompt_ids("hi"))
        with torch.no_grad():
            hidden = tower(tiles(processor, image), output_hidden_states=True).hidden_states[-2][:, 1:]
            top = torch.topk(hidden.norm(dim=-1), 5).indices.sort().values
            expected = model.model.multi_modal_projector(torch.stack([h[i] for h, i in zip(hidden, top)]))
        rows, cols = grid_tiles(height, width, pipe.anyres["pinpoints"], pipe.anyres["tile"])
        assert features.shape[1] == ids.count(pipe.model["image_token_id"]) == 5 * (1 + rows * cols)
        np.testing.assert_allclose(features[0], expected.reshape(-1, expected.shape[-1]).numpy(), rtol=1e-4, atol=1e-4)
        assert len(pipe.generate(image, "hi", max_new_tokens=3).token_ids) == 3


def test_channel_prune_on_the_vision_mlp_equals_pytorch_with_those_channels_removed(anyres_compile, sources, rng):
    """OneVision's SigLIP MLPs lose half their channels, ranked by activation on digits tiled as the runtime tiles
    them; without bias compensation the result is the PyTorch tower with those channels' fc2 columns zeroed."""
    recipe = ("passes:\n  - channel_prune: {vision: {mlp: 0.5}, multiple: 4, bias_compensation: false, "
              f"{CALIBRATION}}}\n")
    bundle = anyres_compile("llava_onevision", recipe, "onevision-pruned.bundle")
    model, processor = sources["llava_onevision"]
    layers = model.model.vision_tower.encoder.layers
    pruned = {int(e["layer"].split(".")[2]): e["removed"] for e in report(bundle, "channel_prune")["changes"]["vision"]["layers"]
              if "channels_before" in e}
    assert sorted(pruned) == list(range(len(layers))) and all(len(r) == 32 for r in pruned.values())
    reference = VisionWithProjector(model, model.config.vision_feature_layer, "full")
    image = random_image(rng, 50, 120)
    pixels = tiles(processor, image)
    with torch.no_grad():
        saved = [layer.mlp.fc2.weight.clone() for layer in layers]
        for index, layer in enumerate(layers):
            layer.mlp.fc2.weight[:, pruned[index]] = 0
        expected = reference(pixels).numpy()
        for layer, weight in zip(layers, saved):
            layer.mlp.fc2.weight.copy_(weight)
    got = load(bundle).runners["vision"].run({"pixel_values": pixels.numpy()})["image_features"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_awq_int4_on_a_biased_qwen2_llm_equals_its_dequantized_pytorch_twin(anyres_compile, sources, rng):
    recipe = f"passes:\n  - awq_int4: {{group_size: 64, lowering: matmulnbits, accuracy_level: 0, {CALIBRATION}}}\n"
    bundle = anyres_compile("llava_onevision", recipe + TRTLLM_OPT_IN, "onevision-awq.bundle")
    checkpoint = report(bundle, "awq_int4")["changes"]["trtllm_checkpoint"]
    assert checkpoint["written"] is True and checkpoint["files"] == ["trtllm/checkpoint/config.json",
                                                                     "trtllm/checkpoint/rank0.safetensors"]
    model = sources["llava_onevision"][0]
    pipe = load(bundle)
    twin = fake_quantized(model, onnx.load(bundle / "llm.onnx"), 2 * 7 + 1)  # lm_head too, though tied
    embeds = rng.normal(size=(1, 9, model.config.text_config.hidden_size)).astype(np.float32)
    logits, _ = pipe.step(embeds, pipe.empty_cache())
    with torch.no_grad():
        expected = twin.lm_head(twin.model.language_model(inputs_embeds=torch.from_numpy(embeds)).last_hidden_state)
    np.testing.assert_allclose(logits, expected.numpy(), rtol=1e-4, atol=1e-4 * np.abs(expected.numpy()).max())


def test_cast_precision_fp16_stays_close_to_fp32_on_siglip_and_qwen2(anyres_compile, onevision_bundle, rng):
    bundle = anyres_compile("llava_onevision", "passes:\n  - cast_precision: {dtype: fp16}\n", "onevision-fp16.bundle")
    lowered = {c: onnx.load(bundle / f"{c}.onnx") for c in ("vision", "llm")}
    assert all(any(t.data_type == onnx.TensorProto.FLOAT16 for t in m.graph.initializer) for m in lowered.values())
    half, full = load(bundle), load(onevision_bundle)
    pixels = rng.normal(size=(3, 3, 32, 32)).astype(np.float32)
    want = full.runners["vision"].run({"pixel_values": pixels})["image_features"]
    got = half.runners["vision"].run({"pixel_values": pixels})["image_features"]
    assert np.abs(got - want).max() / np.abs(want).max() < 3e-3
    image = random_image(rng, 60, 40)
    ids, features = full.encode_image(image, full.prompt_ids("What is it?"))
    embeds = full.embed(np.array([ids], np.int64), features)
    want_logits = full.step(embeds, full.empty_cache())[0]
    got_logits = half.step(embeds, half.empty_cache())[0]
    assert np.abs(got_logits - want_logits).max() / np.abs(want_logits).max() < 1e-2
    assert (got_logits.argmax(-1) == want_logits.argmax(-1)).mean() >= 0.75


def test_paged_kv_layout_decodes_what_the_growing_cache_decodes(anyres_compile, next_bundle, rng):
    paged = load(anyres_compile("llava_next", "passes:\n  - kv_layout: {layout: paged, block_tokens: 16}\n",
                                "next-paged.bundle"))
    plain = load(next_bundle)
    requests_sizes = [(20, 90), (64, 64), (90, 30)]
    for height, width in requests_sizes:
        image = random_image(rng, height, width)
        assert_same_up_to_near_ties(paged.generate(image, "Describe it.", max_new_tokens=6),
                                    plain.generate(image, "Describe it.", max_new_tokens=6))


@pytest.mark.parametrize("family, tail, message", [
    ("llava_next", "passes:\n  - recover: {}\n", "tiles each image"),
])
def test_what_a_pass_cannot_follow_is_refused_at_plan_time(anyres_checkpoints, tmp_path, family, tail, message):
    (tmp_path / "checkpoint").symlink_to(anyres_checkpoints[family], target_is_directory=True)
    (tmp_path / "recipe.yaml").write_text("model: {source: hf, path: checkpoint}\n" + tail)
    with pytest.raises(UserError, match=message) as info:
        make_plan(tmp_path / "recipe.yaml")
    assert "\n" not in str(info.value)


def test_max_tiles_on_a_fixed_size_model_is_refused_at_plan_time(tmp_path):
    (tmp_path / "recipe.yaml").write_text("model: {source: zoo, name: tiny-llava}\nenvelope: {image: {max_tiles: 4}}\n")
    with pytest.raises(UserError, match="max_tiles applies to any-resolution models"):
        make_plan(tmp_path / "recipe.yaml")


TRTLLM_AWQ = f"passes:\n  - awq_int4: {{group_size: 64, {CALIBRATION}}}\n" + TRTLLM_OPT_IN


@pytest.fixture(scope="module", params=["float", "awq"])
def onevision_trtllm(request, anyres_compile):
    """(float or awq, a LLaVA-OneVision bundle with its TensorRT-LLM checkpoint): float (a recipe that only opts
    in) or W4A16_AWQ."""
    recipe = TRTLLM_OPT_IN if request.param == "float" else TRTLLM_AWQ
    return request.param, anyres_compile("llava_onevision", recipe, f"onevision-trtllm-{request.param}.bundle")


def test_trtllm_checkpoint_of_the_qwen2_llm_reproduces_onnx_logits(onevision_trtllm, rng):
    """Random token ids: the numpy decoder gets the checkpoint's embedding rows and rotates by the checkpoint's
    rotary_base at positions 0..n-1, ONNX Runtime the same rows and position_ids."""
    _, bundle = onevision_trtllm
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["tensorrt_llm"]["checkpoint"] == "trtllm/checkpoint"
    assert manifest["tensorrt_llm"]["checkpoint_missing"] is None
    cfg, t = read_checkpoint(bundle / "trtllm" / "checkpoint")
    ids = rng.integers(0, cfg["vocab_size"], 11)
    got = numpy_llama_logits(cfg, t, ids, checkpoint_linear(cfg, t))
    want = graph_logits_as_checkpoint(bundle, ids, t["transformer.vocab_embedding.weight"], np.arange(len(ids))[None])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def qwen2_config(text) -> dict:
    """What QWenConfig.from_hugging_face sets for qwen_type qwen2 (tensorrt_llm/models/qwen/config.py), read from the
    LLM's config: attn_bias for every Qwen type but qwen3, mlp_bias QWenConfig's default, rotary_scaling HF's
    rope_scaling (null for the default RoPE), rotary_base rope_theta, no rotary_embedding_dim (rope_gpt_neox). The
    architecture is the LLM's, Qwen2ForCausalLM, which MODEL_MAP builds as QWenForCausalLM."""
    assert text.model_type == "qwen2" and text.rope_parameters["rope_type"] == "default"
    return {"architecture": "Qwen2ForCausalLM", "qwen_type": "qwen2",
            "num_hidden_layers": text.num_hidden_layers, "num_attention_heads": text.num_attention_heads,
            "hidden_size": text.hidden_size, "intermediate_size": text.intermediate_size,
            "num_key_value_heads": text.num_key_value_heads, "vocab_size": text.vocab_size,
            "head_size": text.hidden_size // text.num_attention_heads, "position_embedding_type": "rope_gpt_neox",
            "max_position_embeddings": text.max_position_embeddings, "hidden_act": text.hidden_act,
            "attn_bias": True, "mlp_bias": False, "rotary_base": text.rope_parameters["rope_theta"],
            "rotary_scaling": None, "tie_word_embeddings": text.tie_word_embeddings}


def test_trtllm_checkpoint_of_the_qwen2_llm_is_what_tensorrt_llm_qwen_declares(onevision_trtllm, sources):
    which, bundle = onevision_trtllm
    folder = bundle / "trtllm" / "checkpoint"
    cfg = json.loads((folder / "config.json").read_text())
    model = sources["llava_onevision"][0]
    text = model.config.text_config
    expected = qwen2_config(text)
    assert {k: cfg[k] for k in expected} == expected and cfg.get("rotary_embedding_dim") is None
    assert engine_mrope(cfg) is None  # the runner sends the prompt table alone, as for a LLaMA engine
    assert np.float32(cfg["norm_epsilon"]) == np.float32(text.rms_norm_eps)
    tensors, dtypes = read_safetensors(folder / "rank0.safetensors")
    shapes = declared_shapes(cfg)
    if which == "awq":
        assert report(bundle, "awq_int4")["changes"]["trtllm_checkpoint"]["written"] is True
        assert cfg["quantization"] == {"quant_algo": "W4A16_AWQ", "group_size": 64, "has_zero_point": False,
                                       "pre_quant_scale": True}  # every linear quantized: no exclude_modules
        shapes = w4a16_shapes(shapes, 64)
    else:
        assert cfg["quantization"] == {"quant_algo": None} and set(dtypes.values()) == {"F16"}
    assert {n: tuple(a.shape) for n, a in tensors.items()} == shapes
    attention = model.model.language_model.layers[1].self_attn
    np.testing.assert_array_equal(tensors["transformer.layers.1.attention.qkv.bias"], np.concatenate(
        [getattr(attention, f"{r}_proj").bias.detach().numpy() for r in "qkv"]).astype(np.float16))


def test_a_qwen2_llm_with_scaled_rope_gets_no_checkpoint_and_the_plan_says_why(anyres_checkpoints, tmp_path):
    """rope_type linear divides the frequencies by its factor: no rotary_base gives them, and the checkpoint is
    written with plain RoPE only."""
    shutil.copytree(anyres_checkpoints["llava_onevision"], tmp_path / "checkpoint")
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    config["text_config"]["rope_parameters"].update({"rope_type": "linear", "factor": 2.0})
    (tmp_path / "checkpoint" / "config.json").write_text(json.dumps(config))
    bundle = compile_to(tmp_path, "model: {source: hf, path: checkpoint}\n" + TRTLLM_OPT_IN)
    trtllm = json.loads((bundle / "manifest.json").read_text())["tensorrt_llm"]
    assert trtllm["checkpoint"] is None and not (bundle / "trtllm").exists()
    assert "rotary frequencies are scaled" in trtllm["checkpoint_missing"]
