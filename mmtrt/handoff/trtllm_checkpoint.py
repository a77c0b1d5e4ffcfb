"""TensorRT-LLM checkpoints (`config.json` + `rank0.safetensors`) of a LLaMA, with W4A16_AWQ or float linears, and
of a Qwen2 LLM (the same tensors plus q/k/v biases, as TensorRT-LLM's QWen: `qwen2_config`), Qwen2-VL's with
QWenConfig's M-RoPE fields (`qwen2_vl_config`).

A float linear `<p>` is `<p>.weight` [out, in] in the checkpoint dtype (docs/source/architecture/checkpoint.md:
linear weights always follow the (out_feature, in_feature) shape), with `quantization.quant_algo` null.

Layout, as modelopt writes it for `trtllm-build` (modelopt/torch/export: `pack_int4_in_uint8`, and
`pack_linear_weights`, which views the bytes as int8 because TensorRT-LLM only preprocesses int8 `.weight` tensors
in `preprocess_perlayer_weights`, tensorrt_llm/models/modeling_utils.py): for each linear `<p>`,
`<p>.weight` int8 [out/2, in] holding signed int4, rows 2j (low nibble) and 2j+1 (high nibble) sharing a byte;
`<p>.weights_scaling_factor` [out, in/group] and `<p>.prequant_scaling_factor` [in], both in the model dtype.
Dequantized weight = q * scale; the activations are multiplied by the pre-quant scale first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from mmtrt.quant.int4 import pack_nibbles

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}

# HF LLaMA module (inside model.layers.N) -> TensorRT-LLM module (inside transformer.layers.N).
# q_proj, k_proj and v_proj all map to attention.qkv: concatenate q, k, v along the output rows (weights and
# scales alike; they share one input, hence one pre-quant scale).
LLAMA_LAYER_NAMES = {
    "self_attn.q_proj": "attention.qkv",
    "self_attn.k_proj": "attention.qkv",
    "self_attn.v_proj": "attention.qkv",
    "self_attn.o_proj": "attention.dense",
    "mlp.gate_proj": "mlp.fc",
    "mlp.up_proj": "mlp.gate",
    "mlp.down_proj": "mlp.proj",
    "input_layernorm": "input_layernorm",
    "post_attention_layernorm": "post_layernorm",
}
LLAMA_TOP_NAMES = {"model.embed_tokens": "transformer.vocab_embedding", "model.norm": "transformer.ln_f",
                   "lm_head": "lm_head"}


def llama_name(hf_name: str) -> str:
    """TensorRT-LLM's name for a parameter of HF's LlamaForCausalLM (`model.layers.3.mlp.up_proj.weight` ->
    `transformer.layers.3.mlp.gate.weight`); a LLaVA caller strips its language-model prefix first."""
    module, _, leaf = hf_name.rpartition(".")
    if module in LLAMA_TOP_NAMES:
        return f"{LLAMA_TOP_NAMES[module]}.{leaf}"
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", module)
    if m is None or m.group(2) not in LLAMA_LAYER_NAMES:
        raise ValueError(f"{hf_name!r} is not a LLaMA parameter TensorRT-LLM's checkpoint names")
    return f"transformer.layers.{m.group(1)}.{LLAMA_LAYER_NAMES[m.group(2)]}.{leaf}"


def linear_tensors(prefix: str, q: np.ndarray, scales: np.ndarray, prequant_scale: np.ndarray,
                   dtype: str) -> dict[str, np.ndarray]:
    """The three checkpoint tensors of one W4A16_AWQ linear from symmetric q [out, in] and scales [out, in/group].

    TensorRT-LLM infers the group as in / scales.shape[1], so `in` must be a whole number of groups; `out` must be
    even (rows are packed in pairs).
    """
    out_features, in_features = q.shape
    if out_features % 2 or in_features % scales.shape[1] or q.min() < -8 or q.max() > 7:
        raise ValueError(f"{prefix}: W4A16_AWQ needs signed int4 q [even out, in = groups * group_size], got "
                         f"q {list(q.shape)} in [{q.min()}, {q.max()}] with {scales.shape[1]} groups")
    pairs = q.reshape(out_features // 2, 2, in_features).transpose(0, 2, 1)  # [out/2, in, (row 2j, row 2j+1)]
    return {
        f"{prefix}.weight": pack_nibbles(pairs)[..., 0].view(np.int8),
        f"{prefix}.weights_scaling_factor": np.asarray(scales).astype(DTYPES[dtype]),
        f"{prefix}.prequant_scaling_factor": np.asarray(prequant_scale).astype(DTYPES[dtype]),
    }


def float_linear_tensors(prefix: str, weight: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
    """The one checkpoint tensor of a float linear from its weight [out, in]."""
    return {f"{prefix}.weight": np.asarray(weight).astype(DTYPES[dtype])}


# The modules TensorRT-LLM's quantize_layers leaves unquantized when a checkpoint gives no exclude_modules
# (tensorrt_llm/quantization/quantize.py): a given list replaces them, so it restates them.
DEFAULT_EXCLUDED = ("*lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding",
                    "*shared_expert_gate")

# The activation types TensorRT-LLM's W4A16 (weight-only INT4) GEMM kernels take: fp16 and bf16, not fp32; a
# float checkpoint is written in the 16-bit types too (the GEMM plugin's, and what cast_precision lowers to).
W4A16_DTYPES = ("float16", "bfloat16")


def trtllm_config(*, dtype: str, vocab_size: int, hidden_size: int, num_hidden_layers: int,
                  num_attention_heads: int, num_key_value_heads: int, head_size: int, intermediate_size: int,
                  norm_epsilon: float, max_position_embeddings: int, rotary_base: float, group_size: int | None,
                  hidden_act: str = "silu") -> dict:
    """config.json of a single-GPU LLaMA checkpoint (keys of TensorRT-LLM's PretrainedConfig and LLaMAConfig):
    W4A16_AWQ with `group_size`, float linears with None. `head_size` is explicit: TensorRT-LLM assumes
    hidden_size / num_attention_heads without it, which is wrong for models whose head_dim differs (Gemma's). No
    exclude_modules here: TensorRT-LLM's default then keeps lm_head and the embedding unquantized (a mixed checkpoint
    adds the list, trtllm_export.llama_checkpoint)."""
    if dtype not in W4A16_DTYPES:
        raise ValueError(f"TensorRT-LLM checkpoints here take dtype {' or '.join(W4A16_DTYPES)}, got {dtype!r} "
                         "(the W4A16 kernels take float16 or bfloat16)")
    quantization = {"quant_algo": None} if group_size is None else {
        "quant_algo": "W4A16_AWQ", "group_size": group_size, "has_zero_point": False, "pre_quant_scale": True}
    return {
        "architecture": "LlamaForCausalLM",
        "dtype": dtype,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_size": head_size,
        "intermediate_size": intermediate_size,
        "hidden_act": hidden_act,
        "norm_epsilon": norm_epsilon,
        "position_embedding_type": "rope_gpt_neox",
        "max_position_embeddings": max_position_embeddings,
        "rotary_base": rotary_base,
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "quantization": quantization,
    }


def qwen2_config(llama: dict, tie_word_embeddings: bool) -> dict:
    """config.json of a Qwen2 LLM (biases on q, k and v, plain RoPE) from the LLaMA one of the same sizes, as
    QWenConfig.from_hugging_face makes it for qwen_type `qwen2` (tensorrt_llm/models/qwen/config.py): attn_bias
    (Attention(bias=attn_bias), dense_bias=False in models/qwen/model.py), mlp_bias False, position_embedding_type
    `rope_gpt_neox`, rotary_scaling the HF config's rope_scaling, which is null for the plain RoPE written here
    (trtllm_export refuses scaled frequencies). MODEL_MAP (tensorrt_llm/models/__init__.py) builds `Qwen2ForCausalLM`
    as QWenForCausalLM. From a LLaVA-OneVision config from_hugging_face says qwen_type `qwen2_llava_onevision`,
    which only renames the HF weights it loads (QWenForCausalLM.from_hugging_face); the network built from a
    checkpoint is qwen2's. lm_head is always written, so `tie_word_embeddings` only records the source model's
    setting."""
    return {**llama, "architecture": "Qwen2ForCausalLM", "qwen_type": "qwen2", "rotary_scaling": None,
            "attn_bias": True, "mlp_bias": False, "tie_word_embeddings": tie_word_embeddings}


def qwen2_vl_config(qwen2: dict, mrope_section: list[int]) -> dict:
    """config.json of Qwen2-VL's (and Qwen2.5-VL's) LLM from the Qwen2 one of the same sizes, as
    QWenConfig.from_hugging_face makes it for qwen_type `qwen2_vl`: position_embedding_type `mrope`,
    rotary_embedding_dim the head size, rotary_scaling the model's M-RoPE sections with type `mrope`. MODEL_MAP
    builds `Qwen2VLForConditionalGeneration` as QWenForCausalLM; Qwen2.5-VL's decoder is the same Qwen2 decoder with
    the same sectioned M-RoPE, and TensorRT-LLM has no other architecture name for it."""
    if sum(mrope_section) * 2 != qwen2["head_size"]:
        raise ValueError(f"M-RoPE sections {mrope_section} do not cover half the head size {qwen2['head_size']}")
    return {**qwen2, "architecture": "Qwen2VLForConditionalGeneration", "qwen_type": "qwen2_vl",
            "position_embedding_type": "mrope", "rotary_embedding_dim": qwen2["head_size"],
            "rotary_scaling": {"type": "mrope", "mrope_section": list(mrope_section)}}


def write_checkpoint(folder: str | Path, config: dict, tensors: dict[str, np.ndarray]) -> Path:
    """Write `config.json` and `rank0.safetensors` (the one rank of a world size of 1) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "rank0.safetensors"))
    return folder
