"""TensorRT-LLM W4A16_AWQ checkpoints, read back with json + numpy alone (the safetensors format parsed by hand, so
bfloat16 reads too) and unpacked from the documented layout, not with the writer's helpers."""

import json

import numpy as np
import pytest

from builders import read_safetensors, unpack_int4_rows
from mmtrt.quant.int4 import dequantize_groups, quantize_groups
from mmtrt.handoff.trtllm_checkpoint import (linear_tensors, llama_name, qwen2_config, qwen2_vl_config, trtllm_config,
                                           write_checkpoint)


def _rounded(a, dtype):
    """What the checkpoint holds for float32 `a` in `dtype`, back in float32 (bfloat16 rounds to nearest even)."""
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        u = a.astype(np.float32).view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).view(np.float32)
    return a.astype(np.float32)


@pytest.mark.parametrize("dtype,group", [("float16", 64), ("bfloat16", 128), ("float16", 32)])
def test_checkpoint_round_trip(rng, tmp_path, dtype, group):
    shapes = {"transformer.layers.0.attention.qkv": (3 * 128, 256), "transformer.layers.0.mlp.proj": (130, 384),
              "transformer.layers.1.mlp.fc": (2, 128)}
    expected, tensors = {}, {}
    for prefix, (out_features, in_features) in shapes.items():
        w = rng.normal(size=(out_features, in_features)).astype(np.float32)
        prequant = rng.uniform(0.5, 2.0, size=in_features).astype(np.float32)
        q, scales, _ = quantize_groups(w, group)
        tensors |= linear_tensors(prefix, q, scales, prequant, dtype)
        expected[prefix] = (dequantize_groups(q, _rounded(scales, dtype), None, group), _rounded(prequant, dtype))
    config = trtllm_config(dtype=dtype, vocab_size=100, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_size=64, intermediate_size=384, norm_epsilon=1e-5,
                           max_position_embeddings=512, rotary_base=10000.0, group_size=group)
    folder = write_checkpoint(tmp_path / "ckpt", config, tensors)

    assert json.loads((folder / "config.json").read_text()) == config
    read, stored_dtypes = read_safetensors(folder / "rank0.safetensors")
    assert set(read) == set(tensors)
    float_type = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}[dtype]
    for prefix, (out_features, in_features) in shapes.items():
        weight, scale, prequant = (read[f"{prefix}.{k}"] for k in
                                   ("weight", "weights_scaling_factor", "prequant_scaling_factor"))
        assert stored_dtypes[f"{prefix}.weight"] == "I8" and weight.shape == (out_features // 2, in_features)
        assert scale.shape == (out_features, in_features // group) and prequant.shape == (in_features,)
        assert {stored_dtypes[f"{prefix}.{k}"] for k in ("weights_scaling_factor", "prequant_scaling_factor")} == {
            float_type}
        deq = unpack_int4_rows(weight).astype(np.float32) * np.repeat(scale.astype(np.float32), group, axis=1)
        np.testing.assert_array_equal(deq, expected[prefix][0])
        np.testing.assert_array_equal(prequant.astype(np.float32), expected[prefix][1])


def test_config_keys():
    config = trtllm_config(dtype="float16", vocab_size=32000, hidden_size=4096, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=8, head_size=256, intermediate_size=11008,
                           norm_epsilon=1e-6, max_position_embeddings=4096, rotary_base=500000.0, group_size=128)
    assert config["architecture"] == "LlamaForCausalLM" and config["hidden_act"] == "silu"
    assert config["head_size"] == 256  # not hidden / heads (128): Gemma-like head_dim is kept
    assert config["position_embedding_type"] == "rope_gpt_neox"
    assert config["mapping"] == {"world_size": 1, "tp_size": 1, "pp_size": 1}
    assert config["quantization"] == {"quant_algo": "W4A16_AWQ", "group_size": 128, "has_zero_point": False,
                                      "pre_quant_scale": True}
    json.dumps(config)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        trtllm_config(**{**kwargs_of(config), "dtype": "float32"})


def qwen2_7b_llama():
    """The sizes of Qwen2-7B's decoder (Qwen2-VL-7B's too): head 128, rope_theta 1e6."""
    return trtllm_config(dtype="bfloat16", vocab_size=152064, hidden_size=3584, num_hidden_layers=28,
                         num_attention_heads=28, num_key_value_heads=4, head_size=128, intermediate_size=18944,
                         norm_epsilon=1e-6, max_position_embeddings=32768, rotary_base=1000000.0, group_size=None)


def test_qwen2_config_keeps_the_sizes_and_plain_rope_and_adds_the_qkv_bias():
    llama = qwen2_7b_llama()
    config = qwen2_config(llama, True)
    assert {k: v for k, v in config.items() if k in llama} == {**llama, "architecture": "Qwen2ForCausalLM"}
    assert config["position_embedding_type"] == "rope_gpt_neox" and config["rotary_scaling"] is None
    assert (config["qwen_type"], config["attn_bias"], config["mlp_bias"], config["tie_word_embeddings"]) == (
        "qwen2", True, False, True)


def test_qwen2_vl_config_keeps_the_sizes_and_needs_sections_covering_half_the_head():
    """Qwen2-VL-7B's decoder: M-RoPE sections [16, 24, 24] (64 frequencies)."""
    qwen2 = qwen2_config(qwen2_7b_llama(), False)
    config = qwen2_vl_config(qwen2, [16, 24, 24])
    renamed = {"architecture": "Qwen2VLForConditionalGeneration", "qwen_type": "qwen2_vl",
               "position_embedding_type": "mrope", "rotary_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    assert {k: v for k, v in config.items() if k in qwen2} == {**qwen2, **renamed}
    assert (config["rotary_embedding_dim"], config["attn_bias"]) == (128, True)
    with pytest.raises(ValueError, match=r"sections \[16, 24, 16\] do not cover half the head size 128"):
        qwen2_vl_config(qwen2, [16, 24, 16])


def kwargs_of(config):
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_size", "intermediate_size", "norm_epsilon", "max_position_embeddings", "rotary_base")
    return {**{k: config[k] for k in keys}, "dtype": config["dtype"],
            "group_size": config["quantization"]["group_size"]}


@pytest.mark.parametrize("hf,trt", [
    ("model.embed_tokens.weight", "transformer.vocab_embedding.weight"),
    ("model.norm.weight", "transformer.ln_f.weight"),
    ("lm_head.weight", "lm_head.weight"),
    ("model.layers.0.input_layernorm.weight", "transformer.layers.0.input_layernorm.weight"),
    ("model.layers.11.post_attention_layernorm.weight", "transformer.layers.11.post_layernorm.weight"),
    ("model.layers.2.self_attn.q_proj.weight", "transformer.layers.2.attention.qkv.weight"),
    ("model.layers.2.self_attn.k_proj.weight", "transformer.layers.2.attention.qkv.weight"),
    ("model.layers.2.self_attn.v_proj.weight", "transformer.layers.2.attention.qkv.weight"),
    ("model.layers.2.self_attn.o_proj.weight", "transformer.layers.2.attention.dense.weight"),
    ("model.layers.3.mlp.gate_proj.weight", "transformer.layers.3.mlp.fc.weight"),
    ("model.layers.3.mlp.up_proj.weight", "transformer.layers.3.mlp.gate.weight"),
    ("model.layers.3.mlp.down_proj.weight", "transformer.layers.3.mlp.proj.weight"),
])
def test_llama_names(hf, trt):
    assert llama_name(hf) == trt


@pytest.mark.parametrize("hf", ["model.layers.0.self_attn.rotary_emb.inv_freq", "vision_tower.x.weight",
                                "model.layers.x.mlp.up_proj.weight"])
def test_unknown_names_are_errors(hf):
    with pytest.raises(ValueError, match="not a LLaMA parameter"):
        llama_name(hf)


@pytest.mark.parametrize("out_features,in_features,groups", [(5, 64, 1), (4, 100, 3)])
def test_linear_tensors_rejects_what_the_layout_cannot_hold(out_features, in_features, groups):
    q = np.zeros((out_features, in_features), np.int8)
    with pytest.raises(ValueError, match="W4A16_AWQ"):
        linear_tensors("p", q, np.ones((out_features, groups), np.float32), np.ones(in_features), "float16")


@pytest.mark.parametrize("group", [16, 32, 256])
def test_groups_tensorrt_llm_kernels_do_not_take_are_not_exported(group):
    """cutlass_kernels/fpA_intB_gemm: "Only group size 64 and 128 supported for fine grained kernels"."""
    from mmtrt.handoff.trtllm_export import NotExportable, llama_checkpoint

    with pytest.raises(NotExportable, match="group_size 64 or 128"):
        llama_checkpoint(None, [], group, "float16", {})
