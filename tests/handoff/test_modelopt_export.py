"""`mmtrt export hf --format modelopt`: a tiny LLaVA awq_int4 bundle as ModelOpt's unified checkpoint (W4A16_AWQ).
The tensors are unpacked by the format's layout, written here from ModelOpt's quant_utils.py
(`pack_int4_in_uint8`: signed int4, output rows 2j / 2j + 1 in the low / high nibble; weight = q * weight_scale
per group; the input times pre_quant_scale first) and must equal the bundle graph's dequantized INT4 weights
exactly; the JSON is checked against the fields TensorRT-LLM's `load_modelopt_quant_config` reads."""

import fnmatch
import json

import numpy as np
import onnx
import pytest
from builders import dequantized_linears
from conftest import ROOT, compile_to
from safetensors import safe_open

from mmtrt.cli import main

GROUP = 32
AWQ = (f"  - awq_int4: {{group_size: {GROUP}, lowering: matmulnbits, accuracy_level: 0, "
       "calibration: {samples: 2, text_windows: 1}}\n")
FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
         "up_proj": "gate_up_proj"}


@pytest.fixture(scope="module")
def awq_llava(tmp_path_factory):
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace("  - graph_cleanup: {}\n", AWQ)
    return compile_to(tmp_path_factory.mktemp("awq"), recipe, "awq.bundle")


def unpack_w4a16(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """uint8 [out / 2, in] and weight_scale [out, in / group] -> the float weight [out, in]."""
    nibbles = np.stack([packed & 0x0F, packed >> 4], axis=1).reshape(packed.shape[0] * 2, packed.shape[1])
    q = np.where(nibbles >= 8, nibbles.astype(np.int16) - 16, nibbles.astype(np.int16)).astype(np.float32)
    return q * np.repeat(scale.astype(np.float32), GROUP, axis=1)


def excluded(patterns: list[str], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def test_an_awq_int4_llm_exports_as_modelopt_w4a16_awq_holding_the_bundles_int4_weights(awq_llava, tmp_path,
                                                                                          capsys):
    out = tmp_path / "hf"
    assert main(["export", "hf", str(awq_llava), str(out), "--format", "modelopt"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"wrote {out}")
    hf_quant = json.loads((out / "hf_quant_config.json").read_text())
    assert hf_quant["producer"]["name"] == "modelopt"
    quant = hf_quant["quantization"]
    assert {k: quant[k] for k in ("quant_algo", "kv_cache_quant_algo", "group_size", "has_zero_point")} == \
        {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": GROUP, "has_zero_point": False}
    exclude = quant["exclude_modules"]
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config == {"quant_method": "modelopt", "quant_algo": "W4A16_AWQ", "ignore": exclude,
                      "producer": hf_quant["producer"]}
    for float_part in ("language_model.lm_head", "multi_modal_projector.linear_1",
                       "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj"):
        assert excluded(exclude, float_part), float_part
    with safe_open(out / "model.safetensors", "np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    quantized = 0
    for name, (weight, _) in dequantized_linears(onnx.load(awq_llava / "llm.onnx")).items():
        if name == "llm.lm_head":
            np.testing.assert_array_equal(tensors["language_model.lm_head.weight"], weight.astype(np.float32))
            continue
        layer, role = name.removeprefix("llm.layers.").split(".")
        block = "self_attn" if role[0] in "qkvo" else "mlp"
        module = f"language_model.model.layers.{layer}.{block}.{role}"
        trtllm_name = f"model.layers.{layer}.{block}.{FUSED.get(role, role)}"
        if f"{module}.weight_scale" not in tensors:
            assert excluded(exclude, module) and excluded(exclude, trtllm_name), module
            np.testing.assert_array_equal(tensors[f"{module}.weight"], weight.astype(np.float32))
            continue
        assert not excluded(exclude, module) and not excluded(exclude, trtllm_name), module
        packed, scale = tensors[f"{module}.weight"], tensors[f"{module}.weight_scale"]
        assert packed.dtype == np.uint8 and packed.shape == (weight.shape[0] // 2, weight.shape[1])
        assert scale.shape == (weight.shape[0], weight.shape[1] // GROUP)
        dense = unpack_w4a16(packed, scale)
        if role in ("o_proj", "down_proj"):  # TensorRT-LLM's plain W4A16 linears read their pre_quant_scale
            pre = tensors[f"{module}.pre_quant_scale"]
            assert pre.shape == (weight.shape[1],)
            dense = dense * pre[None, :]
        else:
            assert f"{module}.pre_quant_scale" not in tensors
        np.testing.assert_array_equal(dense, weight.astype(np.float32))
        quantized += 1
    assert quantized >= 4 * 6
