"""The quantized LLM of an IR as a TensorRT-LLM LLaMA checkpoint with W4A16_AWQ linears.

The checkpoint holds what the ONNX graph computes: the same INT4 weights and scales, the normalisation weights
with AWQ's scales folded in, a pre-quant scale of ones where a norm or a linear absorbed the scale. TensorRT-LLM
keeps lm_head unquantized, so a quantized lm_head is written dequantized (its logits then equal the ONNX ones).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from mmtrt.backends.tensorrt_llm import CHECKPOINT_DIR
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.rewrite import attr
from mmtrt.quant.int4 import dequantize_groups
from mmtrt.quant.quantize import QuantizedLinear
from mmtrt.quant.trtllm_checkpoint import DTYPES, linear_tensors, llama_name, trtllm_config, write_checkpoint

LAYER_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HF_MODULE = {"q_proj": "self_attn.q_proj", "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj",
             "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj"}


class NotExportable(ValueError):
    """The quantized LLM cannot be written as a W4A16_AWQ checkpoint; the message says why."""


def checkpoint_assets(ir: ModelIR, quantized: list[QuantizedLinear], group_size: int, dtype: str) -> dict[str, bytes]:
    """`trtllm/checkpoint/config.json` and `rank0.safetensors` as bundle assets."""
    config, tensors = llama_checkpoint(ir, quantized, group_size, dtype)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_checkpoint(Path(tmp), config, tensors)
        return {f"{CHECKPOINT_DIR}/{p.name}": p.read_bytes() for p in sorted(folder.iterdir())}


def llama_checkpoint(ir: ModelIR, quantized: list[QuantizedLinear], group_size: int,
                     dtype: str) -> tuple[dict, dict[str, np.ndarray]]:
    facts = ir.config["llm"]
    layers = facts["num_layers"]
    found = {(ql.linear.layer, ql.linear.role): ql for ql in quantized}
    missing = [f"llm.layers.{i}.{r}" for i in range(layers) for r in LAYER_ROLES if (i, r) not in found]
    if missing:
        raise NotExportable(f"TensorRT-LLM's W4A16_AWQ quantizes every decoder linear; not quantized: "
                            f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    uneven = sorted({ql.linear.k for ql in found.values() if ql.linear.k % group_size})
    if uneven:
        raise NotExportable(f"TensorRT-LLM needs every linear's input width to be a multiple of group_size "
                            f"{group_size}; {uneven} are not (choose a group size that divides them)")
    model = ir.components["llm"].onnx
    producer = {out: node for node in model.graph.node for out in node.output}
    inits = {t.name: t for t in model.graph.initializer}
    cast = DTYPES[dtype]

    def norm_weight(tensor: str) -> tuple[np.ndarray, float]:
        node = producer.get(tensor)
        if node is None or node.op_type != "RMSNormalization":
            raise NotExportable(f"{tensor} is not made by an RMSNormalization; not a LLaMA decoder")
        return numpy_helper.to_array(inits[node.input[1]]).astype(cast), attr(node, "epsilon", 1e-5)

    tensors = {llama_name("model.embed_tokens.weight"): _embedding(ir).astype(cast)}
    for i in range(layers):
        q, k, v = (found[(i, r)] for r in ("q_proj", "k_proj", "v_proj"))
        tensors[llama_name(f"model.layers.{i}.input_layernorm.weight")], eps = norm_weight(q.linear.input)
        tensors[llama_name(f"model.layers.{i}.post_attention_layernorm.weight")], _ = norm_weight(
            found[(i, "gate_proj")].linear.input)
        tensors |= linear_tensors(_prefix(i, "q_proj"), np.concatenate([q.q, k.q, v.q]),
                                  np.concatenate([q.scales, k.scales, v.scales]), _prequant(q), dtype)
        for role in ("o_proj", "gate_proj", "up_proj", "down_proj"):
            ql = found[(i, role)]
            tensors |= linear_tensors(_prefix(i, role), ql.q, ql.scales, _prequant(ql), dtype)
    head = next((ql for ql in quantized if ql.linear.role == "lm_head"), None)
    logits = producer["logits"]
    tensors[llama_name("model.norm.weight")], _ = norm_weight(logits.input[0] if head is None else head.linear.input)
    tensors[llama_name("lm_head.weight")] = (_lm_head(inits, logits) if head is None else _dequantized(head)).astype(cast)
    config = trtllm_config(
        dtype=dtype, vocab_size=tensors["lm_head.weight"].shape[0], hidden_size=facts["hidden_size"],
        num_hidden_layers=layers, num_attention_heads=facts["num_heads"], num_key_value_heads=facts["num_kv_heads"],
        head_size=facts["head_dim"], intermediate_size=found[(0, "gate_proj")].linear.n, norm_epsilon=float(eps),
        max_position_embeddings=facts["max_position_embeddings"], rotary_base=_rotary_base(model, facts["head_dim"]),
        group_size=group_size)
    return config, tensors


def _prefix(layer: int, role: str) -> str:
    return llama_name(f"model.layers.{layer}.{HF_MODULE[role]}.weight").removesuffix(".weight")


def _prequant(ql: QuantizedLinear) -> np.ndarray:
    return np.ones(ql.linear.k, np.float32) if ql.prequant is None else ql.prequant


def _dequantized(ql: QuantizedLinear) -> np.ndarray:
    """The float weight an unquantized lm_head needs to compute what the quantized one does."""
    group = -(-ql.linear.k // ql.scales.shape[1])
    w = dequantize_groups(ql.q, ql.scales, ql.zero_points, group)
    return w if ql.prequant is None else w * ql.prequant[None, :]


def _lm_head(inits: dict[str, onnx.TensorProto], logits: onnx.NodeProto) -> np.ndarray:
    if logits.op_type != "MatMul" or logits.input[1] not in inits:
        raise NotExportable("the LLM's logits are not made by a MatMul with a constant weight")
    return numpy_helper.to_array(inits[logits.input[1]]).T


def _embedding(ir: ModelIR) -> np.ndarray:
    graph = ir.components["embed"].onnx.graph
    inits = {t.name: t for t in graph.initializer}
    gathers = [n for n in graph.node if n.op_type == "Gather" and n.input[0] in inits]
    if len(gathers) != 1:
        raise NotExportable("the embed graph is not one Gather from a constant table")
    return numpy_helper.to_array(inits[gathers[0].input[0]])


def _rotary_base(model: onnx.ModelProto, head_dim: int) -> float:
    """The RoPE base from the inverse frequencies the graph multiplies positions by, inv_freq[i] = base^(-2i/d);
    a scaled RoPE (other frequencies) has no plain base and is refused."""
    inits = {t.name: t for t in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    for cos in (n for n in model.graph.node if n.op_type == "Cos"):
        mul = producer.get(cos.input[0])
        for name in (mul.input if mul is not None and mul.op_type == "Mul" else []):
            inv = numpy_helper.to_array(inits[name]).astype(np.float64).reshape(-1) if name in inits else None
            if inv is not None and inv.size == head_dim // 2 and inv.size > 1:
                base = float(inv[1] ** (-head_dim / 2))
                if np.allclose(inv, base ** (-np.arange(0, head_dim, 2) / head_dim), rtol=1e-4):
                    return float(f"{base:.5g}")  # float32 frequencies give the base to about 6 digits
                raise NotExportable("the LLM's rotary frequencies are scaled; W4A16 export supports plain RoPE only")
    raise NotExportable("no rotary inverse frequencies found in the LLM graph")
