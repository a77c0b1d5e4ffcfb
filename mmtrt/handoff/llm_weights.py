"""The LLM's float weights as the bundle's graphs hold them, under transformers' decoder names
(`layers.3.self_attn.q_proj.weight`, `embed_tokens.weight`, `norm.weight`, `lm_head.weight`), so an export carries
the LLM after the bundle's passes: a channel-pruned width is the shape the graph has.

The structure is read as the TensorRT-LLM checkpoint reads it (handoff/trtllm_export.py): each decoder linear is a
float MatMul that the linear finder names by layer and role, a norm is the RMSNormalization that feeds q_proj
(input_layernorm) or gate_proj (post_attention_layernorm), a bias is the constant Add after a projection, the
embedding is the embed graph's table. A graph that is not that (INT4 linears, fused projections or norms) is
refused with the reason."""

from __future__ import annotations

import numpy as np
import onnx

from mmtrt.handoff.awq_gemm import dequantized, int4_linears
from mmtrt.handoff.trtllm_export import (
    HF_MODULE,
    LAYER_ROLES,
    NotExportable,
    _bias,
    _embedding,
    _lm_head,
    _through_casts,
)
from mmtrt.ir import source_weights
from mmtrt.quant.linears import find_linears

HF_ROLE = {**HF_MODULE, "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj"}


class _Graphs:
    """What trtllm_export's readers take of a ModelIR: the embed graph."""

    def __init__(self, embed: onnx.ModelProto):
        self.components = {"embed": type("Component", (), {"onnx": embed})}


def llm_tensors(llm: onnx.ModelProto, embed: onnx.ModelProto, num_layers: int) -> dict[str, np.ndarray]:
    """Every decoder tensor (float32) by its transformers name, from the llm and embed graphs; an INT4 linear
    (awq_int4's MatMulNBits) as the float weight it computes with (handoff/awq_gemm.py writes its INT4 form)."""
    _, linears, _ = find_linears(llm, "llm")
    floats = {(lin.layer, lin.role): lin for lin in linears if lin.role in LAYER_ROLES}
    int4 = int4_linears(llm)
    found = {key: (_array_of(llm, lin.weight).T, lin.input, lin.output) for key, lin in floats.items()}
    found |= {key: (dequantized(lin), lin["x"], lin["output"]) for key, lin in int4.items() if key[0] >= 0}
    missing = [f"layers.{i}.{r}" for i in range(num_layers) for r in LAYER_ROLES if (i, r) not in found]
    if missing:
        raise NotExportable(f"the bundle's LLM is not a decoder of float MatMul or MatMulNBits linears (not found: "
                            f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; awq_int4 exports from "
                            "lowering: matmulnbits)")
    inits = {t.name: t for t in llm.graph.initializer}
    producer = {out: node for node in llm.graph.node for out in node.output}

    def norm(tensor: str) -> np.ndarray:
        node = _through_casts(producer, tensor)
        if node is None or node.op_type != "RMSNormalization":
            raise NotExportable(f"{tensor} is not made by an RMSNormalization (a fused norm is not a checkpoint's)")
        return _array(inits[node.input[1]])

    tensors = {"embed_tokens.weight": _embedding(_Graphs(embed)).astype(np.float32)}
    for (layer, role), (weight, _, output) in sorted(found.items()):
        name = f"layers.{layer}.{HF_ROLE[role]}"
        tensors[f"{name}.weight"] = weight
        bias = _bias(output, llm, producer, inits)
        if bias is not None:
            tensors[f"{name}.bias"] = bias
    for layer in range(num_layers):
        tensors[f"layers.{layer}.input_layernorm.weight"] = norm(found[(layer, "q_proj")][1])
        tensors[f"layers.{layer}.post_attention_layernorm.weight"] = norm(found[(layer, "gate_proj")][1])
    head = int4.get((-1, "lm_head"))
    if head is not None:
        tensors["lm_head.weight"], head_input = dequantized(head), head["x"]
    else:
        logits = _through_casts(producer, "logits")
        tensors["lm_head.weight"], head_input = _lm_head(inits, producer, logits).astype(np.float32), logits.input[0]
    tensors["norm.weight"] = norm(head_input)
    return tensors


def _array_of(model: onnx.ModelProto, name: str) -> np.ndarray:
    return _array(next(t for t in model.graph.initializer if t.name == name))


def _array(tensor: onnx.TensorProto) -> np.ndarray:
    return source_weights.array(tensor).astype(np.float32)
