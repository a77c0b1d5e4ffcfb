"""The LLM of an IR as a TensorRT-LLM LLaMA checkpoint: W4A16_AWQ linears when quantized, float ones otherwise.
An LLM with biases on q, k and v (Qwen2's) is the same checkpoint with them as `attention.qkv.bias` and QWenConfig's
qwen_type `qwen2` (trtllm_checkpoint.qwen2_config), or `qwen2_vl` for an M-RoPE one (Qwen2-VL's: qwen2_vl_config).

The checkpoint holds what the ONNX graph computes: the same INT4 weights and scales, the normalisation weights
with AWQ's scales folded in, a pre-quant scale of ones where a norm or a linear absorbed the scale, the embedding
as the embed graph dequantizes it. TensorRT-LLM keeps lm_head unquantized, so a quantized lm_head is written
dequantized (its logits then equal the ONNX ones).

A mixed bundle (linears awq_int4 kept in float, or did not select) is one W4A16_AWQ checkpoint whose quantization
config lists the float modules in `exclude_modules` (tensorrt_llm/models/modeling_utils.py QuantConfig; matched with
fnmatch by quantization/quantize.py quantize_layers, which then leaves the module in the checkpoint's float dtype).
A given list replaces TensorRT-LLM's default one, so it restates the defaults (lm_head, the embeddings, ...). Module
granularity is TensorRT-LLM's: q, k and v share `attention.qkv`, and `mlp.fc` (gate_proj) goes with `mlp.gate`
(up_proj) because fuse_gate_mlp concatenates both weights as float when fc is unquantized; a module with any float
member is written float, its INT4 members dequantized. So is a module whose input width is not a whole number of
groups: TensorRT-LLM's INT4 kernels take whole groups of 64 or 128 only.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx

from mmtrt.handoff.trtllm_plan import CHECKPOINT_DIR
from mmtrt.ir import source_weights
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.logits import is_logits_slice
from mmtrt.ir.rewrite import attr
from mmtrt.quant import TRTLLM_GROUPS
from mmtrt.quant.int4 import dequantize_groups
from mmtrt.quant.linears import Linear, find_linears
from mmtrt.quant.quantize import QuantizedLinear
from mmtrt.handoff.trtllm_checkpoint import (DEFAULT_EXCLUDED, DTYPES, float_linear_tensors, linear_tensors, llama_name,
                                           qwen2_config, qwen2_vl_config, trtllm_config, write_checkpoint)

LAYER_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QKV = ("q_proj", "k_proj", "v_proj")  # one TensorRT-LLM module, attention.qkv
HF_MODULE = {"q_proj": "self_attn.q_proj", "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj",
             "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj"}


class NotExportable(ValueError):
    """The LLM cannot be written as a TensorRT-LLM checkpoint; the message says why."""


def checkpoint_assets(ir: ModelIR, quantized: list[QuantizedLinear], group_size: int, dtype: str,
                      outputs: dict[tuple[int, str], str]) -> tuple[dict[str, bytes], dict[str, str]]:
    """`trtllm/checkpoint/config.json` and `rank0.safetensors` of the W4A16_AWQ LLM as bundle assets, and the
    modules written in float with why. `outputs`: every decoder linear's output tensor by (layer, role)."""
    config, tensors, excluded = llama_checkpoint(ir, quantized, group_size, dtype, outputs)
    return _assets(config, tensors), excluded


def float_checkpoint_assets(ir: ModelIR, dtype: str) -> dict[str, bytes]:
    """The same two files for a float LLM (fp32, or fp16/bf16 after cast_precision), its weights in `dtype`."""
    return _assets(*float_checkpoint(ir, dtype))


def _assets(config: dict, tensors: dict[str, np.ndarray]) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_checkpoint(Path(tmp), config, tensors)
        return {f"{CHECKPOINT_DIR}/{p.name}": p.read_bytes() for p in sorted(folder.iterdir())}


def llama_checkpoint(ir: ModelIR, quantized: list[QuantizedLinear], group_size: int, dtype: str,
                     outputs: dict[tuple[int, str], str]) -> tuple[dict, dict[str, np.ndarray], dict[str, str]]:
    if group_size not in TRTLLM_GROUPS:
        raise NotExportable(f"TensorRT-LLM's INT4 kernels take group_size {' or '.join(map(str, TRTLLM_GROUPS))} "
                            f"(\"Only group size 64 and 128 supported for fine grained kernels\"), not {group_size}")
    found = {(ql.linear.layer, ql.linear.role): ql for ql in quantized}
    graph_linears = _graph_linears(ir, {key: out for key, out in outputs.items() if key not in found})
    floats = {key: weight for key, (_, weight) in graph_linears.items()}
    _check_layers(ir, {**floats, **found}, "the LLM is not a LLaMA of linears TensorRT-LLM can take; not found")
    why = {key: "kept in float by awq_int4" for key in floats}
    why |= {key: f"input width {ql.linear.k} is not a whole number of {group_size}-groups"
            for key, ql in found.items() if ql.linear.k % group_size}
    for layer in range(ir.config["llm"]["num_layers"]):
        for unit in (QKV, ("gate_proj", "up_proj")):
            reasons = [why[(layer, role)] for role in unit if (layer, role) in why]
            why |= {(layer, role): why.get((layer, role), f"shares its module with a float one ({reasons[0]})")
                    for role in unit if reasons}
    excluded: dict[str, str] = {}

    def linear(prefix: str, keys: list[tuple[int, str]]) -> dict[str, np.ndarray]:
        if not any(key in why for key in keys):
            qls = [found[k] for k in keys]
            return linear_tensors(prefix, np.concatenate([ql.q for ql in qls]),
                                  np.concatenate([ql.scales for ql in qls]), _prequant(qls[0]), dtype)
        excluded[prefix] = "; ".join(dict.fromkeys(why[k] for k in keys if k in why))
        weights = [floats[k] if k in floats else _dequantized(found[k]) for k in keys]
        return float_linear_tensors(prefix, np.concatenate(weights), dtype)

    head = next((ql for ql in quantized if ql.linear.role == "lm_head"), None)
    head_weight = None if head is None else (_dequantized(head), head.linear.input)
    linears = {key: lin for key, (lin, _) in graph_linears.items()} | {k: ql.linear for k, ql in found.items()}
    config, tensors = _llama(ir, linears, linear, head_weight, dtype, group_size)
    if excluded:
        config["quantization"]["exclude_modules"] = [*DEFAULT_EXCLUDED, *excluded]
    return config, tensors, excluded


def _graph_linears(ir: ModelIR, outputs: dict[tuple[int, str], str]) -> dict[tuple[int, str], tuple[Linear, np.ndarray]]:
    """Each linear still a float MatMul in the graph, with its weight [out, in] (an initializer, or an fp16
    initializer cast to the graph's type: awq_int4's float_dtype float16)."""
    graph = ir.components["llm"].onnx.graph
    producer = {o: n for n in graph.node for o in n.output}
    inits = {t.name: t for t in graph.initializer}
    weights = {}
    for key, out in outputs.items():
        node = producer.get(out)
        if node is None or node.op_type != "MatMul":
            continue
        name = node.input[1]
        while name in producer and producer[name].op_type == "Cast":
            name = producer[name].input[0]
        if name in inits:
            weight = source_weights.array(inits[name]).astype(np.float32)
            weights[key] = (Linear(node, name, *weight.shape, layer=key[0], role=key[1]), weight.T)
    return weights


def float_checkpoint(ir: ModelIR, dtype: str) -> tuple[dict, dict[str, np.ndarray]]:
    model = ir.components["llm"].onnx
    _, linears, _ = find_linears(model, "llm")
    found = {(lin.layer, lin.role): lin for lin in linears if lin.role in LAYER_ROLES}
    _check_layers(ir, found, "the LLM is not a LLaMA of float MatMul linears TensorRT-LLM can take; not found")
    inits = {t.name: t for t in model.graph.initializer}

    def linear(prefix: str, keys: list[tuple[int, str]]) -> dict[str, np.ndarray]:
        weights = [source_weights.array(inits[found[k].weight]).T for k in keys]  # ONNX holds W as [in, out]
        return float_linear_tensors(prefix, np.concatenate(weights), dtype)

    return _llama(ir, found, linear, None, dtype, None)


def _check_layers(ir: ModelIR, found: dict, problem: str) -> None:
    layers = ir.config["llm"]["num_layers"]
    missing = [f"llm.layers.{i}.{r}" for i in range(layers) for r in LAYER_ROLES if (i, r) not in found]
    if missing:
        raise NotExportable(f"{problem}: {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")


def _llama(ir: ModelIR, found: dict[tuple[int, str], Linear], linear, head: tuple[np.ndarray, str] | None,
           dtype: str, group_size: int | None) -> tuple[dict, dict[str, np.ndarray]]:
    """Embedding, norms, linears (`linear(prefix, keys)` writes one, q/k/v concatenated) and lm_head (`head`: its
    float weight and input when quantized, else read from the graph) of a LLaMA checkpoint, and its config."""
    facts = ir.config["llm"]
    model = ir.components["llm"].onnx
    producer = {out: node for node in model.graph.node for out in node.output}
    inits = {t.name: t for t in model.graph.initializer}
    cast = DTYPES[dtype]
    biases = {key: b for key, lin in found.items() if (b := _bias(lin.output, model, producer, inits)) is not None}
    mrope = facts.get("rope") == "mrope"
    _check_biases(set(biases), facts, mrope)

    def norm_weight(tensor: str) -> tuple[np.ndarray, float]:
        node = _through_casts(producer, tensor)
        if node is None or node.op_type != "RMSNormalization":
            raise NotExportable(f"{tensor} is not made by an RMSNormalization; not a LLaMA decoder")
        return source_weights.array(inits[node.input[1]]).astype(cast), attr(node, "epsilon", 1e-5)

    tensors = {llama_name("model.embed_tokens.weight"): _embedding(ir).astype(cast)}
    for i in range(facts["num_layers"]):
        tensors[llama_name(f"model.layers.{i}.input_layernorm.weight")], eps = norm_weight(found[(i, "q_proj")].input)
        tensors[llama_name(f"model.layers.{i}.post_attention_layernorm.weight")], _ = norm_weight(
            found[(i, "gate_proj")].input)
        tensors |= linear(_prefix(i, "q_proj"), [(i, r) for r in QKV])
        if biases:
            tensors[f"{_prefix(i, 'q_proj')}.bias"] = np.concatenate([biases[(i, r)] for r in QKV]).astype(cast)
        for role in ("o_proj", "gate_proj", "up_proj", "down_proj"):
            tensors |= linear(_prefix(i, role), [(i, role)])
    logits = _through_casts(producer, "logits")
    head_weight, head_input = head if head is not None else (_lm_head(inits, producer, logits), logits.input[0])
    tensors[llama_name("model.norm.weight")], _ = norm_weight(head_input)
    tensors[llama_name("lm_head.weight")] = head_weight.astype(cast)
    config = trtllm_config(
        dtype=dtype, vocab_size=tensors["lm_head.weight"].shape[0], hidden_size=facts["hidden_size"],
        num_hidden_layers=facts["num_layers"], num_attention_heads=facts["num_heads"],
        num_key_value_heads=facts["num_kv_heads"], head_size=facts["head_dim"],
        intermediate_size=found[(0, "gate_proj")].n, norm_epsilon=float(eps),
        max_position_embeddings=facts["max_position_embeddings"], rotary_base=_rotary_base(model, facts["head_dim"]),
        group_size=group_size)
    if biases:
        config = qwen2_config(config, facts.get("tie_word_embeddings", False))
    if mrope:
        config = qwen2_vl_config(config, facts["mrope_section"])
    return config, tensors


def _check_biases(biased: set[tuple[int, str]], facts: dict, mrope: bool) -> None:
    """LLaMA's linears have no bias; QWen's (QWenConfig attn_bias, dense_bias=False, mlp_bias False) have one on q, k
    and v of every layer and nowhere else, and Qwen2-VL's M-RoPE decoder is a QWen."""
    qkv = {(i, r) for i in range(facts["num_layers"]) for r in QKV}
    if biased == qkv or not (biased or mrope):
        return
    names = sorted(f"llm.layers.{layer}.{role}" for layer, role in biased)
    listed = f"{', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
    if mrope:
        raise NotExportable(f"the M-RoPE LLM's biased linears are [{listed}]; TensorRT-LLM's Qwen2-VL checkpoint "
                            "has a bias on q, k and v of every layer and nowhere else")
    raise NotExportable(f"the LLM's biased linears are [{listed}] ({facts['model_type']}); TensorRT-LLM's checkpoints "
                        "take LLaMA's bias-free linears or QWen's bias on q, k and v of every layer and nowhere else")


def _bias(tensor: str, model: onnx.ModelProto, producer: dict[str, onnx.NodeProto],
          inits: dict[str, onnx.TensorProto]) -> np.ndarray | None:
    """The constant `tensor` (a linear's output) is added to, as a biased projection's is (looking through Casts)."""
    for node in model.graph.node:
        if node.op_type == "Add" and tensor in node.input:
            name = next((i for i in node.input if i != tensor), tensor)
            while name in producer and producer[name].op_type == "Cast":
                name = producer[name].input[0]
            if name in inits:
                return source_weights.array(inits[name]).astype(np.float32)
    return None


def _through_casts(producer: dict[str, onnx.NodeProto], tensor: str) -> onnx.NodeProto | None:
    """The node that makes `tensor`, looking through the Casts cast_precision inserts and kv_layout's Slice of the
    positions the lm_head reads (both keep the values a checkpoint holds)."""
    node = producer.get(tensor)
    while node is not None and (node.op_type == "Cast" or is_logits_slice(node)):
        node = producer.get(node.input[0])
    return node


def _prefix(layer: int, role: str) -> str:
    return llama_name(f"model.layers.{layer}.{HF_MODULE[role]}.weight").removesuffix(".weight")


def _prequant(ql: QuantizedLinear) -> np.ndarray:
    return np.ones(ql.linear.k, np.float32) if ql.prequant is None else ql.prequant


def _dequantized(ql: QuantizedLinear) -> np.ndarray:
    """The float weight an unquantized lm_head needs to compute what the quantized one does."""
    group = -(-ql.linear.k // ql.scales.shape[1])
    w = dequantize_groups(ql.q, ql.scales, ql.zero_points, group)
    return w if ql.prequant is None else w * ql.prequant[None, :]


def _lm_head(inits: dict[str, onnx.TensorProto], producer: dict, logits: onnx.NodeProto | None) -> np.ndarray:
    """[vocab, hidden]; a bundle's tied lm_head is the token table through a Transpose (bundle/stored.py)."""
    name = None if logits is None or logits.op_type != "MatMul" else logits.input[1]
    while name in producer and producer[name].op_type == "Cast":
        name = producer[name].input[0]
    if name in producer and producer[name].op_type == "Transpose" and producer[name].input[0] in inits:
        return source_weights.array(inits[producer[name].input[0]])
    if name not in inits:
        raise NotExportable("the LLM's logits are not made by a MatMul with a constant weight")
    return source_weights.array(inits[name]).T


def _embedding(ir: ModelIR) -> np.ndarray:
    """The token embedding table as the embed graph computes it: one Gather from a constant table, or awq_int4's
    int8 rows (Gather from an int8 [V, H] table and from its row scales [V, 1], multiplied)."""
    graph = ir.components["embed"].onnx.graph
    inits = {t.name: t for t in graph.initializer}
    tables = [source_weights.array(inits[n.input[0]]) for n in graph.node if n.op_type == "Gather" and n.input[0] in inits]
    if len(tables) == 1:
        return tables[0]
    rows = [t for t in tables if t.dtype == np.int8]
    scales = [t for t in tables if t.dtype != np.int8 and t.ndim == 2 and t.shape[1] == 1]
    if len(tables) == 2 and len(rows) == 1 and len(scales) == 1 and len(rows[0]) == len(scales[0]):
        return rows[0].astype(np.float32) * scales[0].astype(np.float32)
    raise NotExportable("the embed graph is neither one Gather from a constant table nor awq_int4's int8 rows")


def _rotary_base(model: onnx.ModelProto, head_dim: int) -> float:
    """The RoPE base from the inverse frequencies the graph multiplies positions by, inv_freq[i] = base^(-2i/d);
    a scaled RoPE (other frequencies) has no plain base and is refused."""
    inits = {t.name: t for t in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    for cos in (n for n in model.graph.node if n.op_type == "Cos"):
        mul = _through_casts(producer, cos.input[0])
        for name in (mul.input if mul is not None and mul.op_type == "Mul" else []):
            inv = source_weights.array(inits[name]).astype(np.float64).reshape(-1) if name in inits else None
            if inv is not None and inv.size == head_dim // 2 and inv.size > 1:
                base = float(inv[1] ** (-head_dim / 2))
                if np.allclose(inv, base ** (-np.arange(0, head_dim, 2) / head_dim), rtol=1e-4):
                    return float(f"{base:.5g}")  # float32 frequencies give the base to about 6 digits
                raise NotExportable("the LLM's rotary frequencies are scaled (not base^(-2i/d)); the checkpoint "
                                    "is written for plain RoPE only (rotary_scaling null)")
    raise NotExportable("no rotary inverse frequencies found in the LLM graph")
