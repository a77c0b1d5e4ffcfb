"""An awq_int4 LLM in NVIDIA ModelOpt's unified Hugging Face checkpoint (W4A16_AWQ), which TensorRT-LLM's LLM
API (`tensorrt_llm.LLM`, `trtllm-serve`) loads, written as ModelOpt's export writes it and TensorRT-LLM reads it:

- TensorRT-Model-Optimizer modelopt/torch/export/quant_utils.py: `pack_int4_in_uint8` (signed q in [-8, 7],
  two consecutive output channels per byte, the even one in the low nibble: uint8 [out / 2, in]),
  `get_scaling_factor` (float scale per output channel and group: `weight_scale` [out, in / group], weight =
  q * scale, no zero point), `process_layer_quant_config` and `get_quant_config` (hf_quant_config.json's fields);
  unified_export_hf.py `export_hf_checkpoint` (hf_quant_config.json beside config.json, whose
  `quantization_config` is convert_hf_config.py's `convert_hf_quant_config_format`);
- TensorRT-LLM tensorrt_llm/_torch/modules/linear.py `W4A16_AWQ_LinearMethod`: a plain linear (o_proj,
  down_proj) needs `pre_quant_scale` [in] (the input is multiplied by it first); the fused q/k/v and gate/up
  loads read only `weight` and `weight_scale`. tensorrt_llm/_torch/model_config.py `load_modelopt_quant_config`
  reads quant_algo, kv_cache_quant_algo, group_size and exclude_modules (fnmatch on module names).

A linear that the format cannot hold as INT4 is written in float and listed in exclude_modules (by its Hub name
and TensorRT-LLM's fused one): an asymmetric grid, a pre-quant scale on a fused input, widths not whole groups or
pairs; fused units go to float together."""

from __future__ import annotations

import numpy as np

from mmtrt.handoff.awq_gemm import int4_linears, units_in_float
from mmtrt.handoff.trtllm_export import NotExportable

PRODUCER = {"name": "modelopt", "version": "0.40.0"}  # the ModelOpt release whose export this follows
PLAIN = ("o_proj", "down_proj")  # loaded one by one, with their pre_quant_scale
FUSED_NAME = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
              "up_proj": "gate_up_proj"}
FLOAT_PARTS = ("vision_tower*", "visual*", "multi_modal_projector*", "*lm_head")


def pack_pairs(q: np.ndarray) -> np.ndarray:
    """Signed int4 [out, in] -> uint8 [out / 2, in]: row 2j in the low nibble, row 2j + 1 in the high one."""
    nibbles = (q.astype(np.int16) & 0x0F).astype(np.uint8)
    return nibbles[0::2] | (nibbles[1::2] << 4)


def modelopt_tensors(lin: dict, role: str) -> dict[str, np.ndarray]:
    """weight (uint8), weight_scale (float32) and, for a plain linear, pre_quant_scale (ones where none)."""
    q = lin["q"].astype(np.int16) - np.repeat(lin["zeros"], lin["block"], axis=1)[:, : lin["q"].shape[1]]
    tensors = {"weight": pack_pairs(q), "weight_scale": lin["scales"].astype(np.float32)}
    if role in PLAIN:
        k = lin["q"].shape[1]
        tensors["pre_quant_scale"] = np.ones(k, np.float32) if lin["prequant"] is None else lin["prequant"]
    return tensors


def float_reasons(int4: dict, num_layers: int, roles: tuple[str, ...]) -> dict:
    """(layer, role) -> why it is written in float; whole fused units go together."""
    return units_in_float(int4, num_layers, roles, _w4a16_reason)


def _w4a16_reason(lin: dict, role: str) -> str | None:
    if (lin["zeros"] != 8).any():
        return "its INT4 grid has zero points (W4A16_AWQ is symmetric)"
    if lin["prequant"] is not None and role not in PLAIN:
        return "its input is scaled first and TensorRT-LLM's fused linears take no pre-quant scale"
    if lin["q"].shape[1] % lin["block"] or lin["q"].shape[0] % 2:
        return "its widths are not whole groups and pairs"
    return None


def modelopt_state(graph, num_layers: int):
    """The decoder modules written as W4A16_AWQ (module -> tensors), the float ones' names, the group size and
    the reasons; ({}, [], None, {}) for an LLM without INT4 linears."""
    from mmtrt.handoff.llm_weights import HF_ROLE
    from mmtrt.handoff.trtllm_export import LAYER_ROLES

    int4 = {key: lin for key, lin in int4_linears(graph).items() if key[0] >= 0}
    if not int4:
        return {}, [], None, {}
    groups = {lin["block"] for lin in int4.values()}
    if len(groups) > 1:
        raise NotExportable(f"the LLM's INT4 linears use several group sizes ({sorted(groups)}); W4A16_AWQ has one")
    why = float_reasons(int4, num_layers, LAYER_ROLES)
    quantized = {f"layers.{layer}.{HF_ROLE[role]}": modelopt_tensors(lin, role) for (layer, role), lin in int4.items()
                 if (layer, role) not in why}
    floats = [f"layers.{layer}.{HF_ROLE[role]}" for layer, role in sorted(why)]
    return quantized, floats, groups.pop(), why


def quant_configs(group: int, exclude: list[str]) -> tuple[dict, dict]:
    """(hf_quant_config.json, config.json's quantization_config) as ModelOpt writes them for W4A16_AWQ."""
    quantization = {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": group,
                    "has_zero_point": False, "pre_quant_scale": True, "exclude_modules": sorted(exclude)}
    hf_quant = {"producer": PRODUCER, "quantization": quantization}
    return hf_quant, {"ignore": sorted(exclude), "quant_algo": "W4A16_AWQ", "producer": PRODUCER,
                      "quant_method": "modelopt"}


def exclude_names(hub_floats: list[str], floats: list[str]) -> list[str]:
    """exclude_modules: the float modules by Hub name, TensorRT-LLM's fused names under any prefix, and the
    vision tower, projector and lm_head (float in the folder)."""
    fused = {f"*{f.rsplit('.', 1)[0]}.{FUSED_NAME[f.rsplit('.', 1)[1]]}" for f in floats
             if f.rsplit(".", 1)[1] in FUSED_NAME}
    return sorted({*hub_floats, *fused, *FLOAT_PARTS})
