"""An awq_int4 LLM's INT4 linears in AutoAWQ's GEMM packing, which vLLM (CPUWNA16 on the CPU) and transformers'
AWQ loader read: per linear `qweight` int32 [in, out/8], `qzeros` int32 [in/group, out/8] and `scales` [in/group,
out], eight 4-bit values per int32 in the order [0, 2, 4, 6, 1, 3, 5, 7] (AutoAWQ's WQLinear_GEMM.from_linear);
weight[o, i] = (q[i, o] - zero[i // group, o]) * scale[i // group, o]. The config's `quantization_config` is
{quant_method: awq, version: gemm, bits: 4, group_size, zero_point: true, modules_to_not_convert}.

The INT4 weights are read from the bundle's `com.microsoft.MatMulNBits` nodes (uint8 B [N, blocks, block/2], low
nibble first along K; scales [N * blocks]; zero points packed two per byte per row, 8 when absent, so a symmetric
grid is q + 8 with zero 8). A linear the format cannot hold as INT4 is written in float, dequantized as the graph
computes it, and named in `modules_to_not_convert`: one awq_int4 kept in float, one whose input the graph scales
first (a pre-quant Mul: AutoAWQ folds every scale into the op before), one whose widths are not whole groups or
eights. vLLM fuses q/k/v and gate/up, so those go to float together."""

from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import numpy_helper

from mmtrt.handoff.trtllm_export import NotExportable
from mmtrt.ir.rewrite import attr

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
NODE_NAME = re.compile(r"llm\.(?:layers\.(\d+)\.)?(\w+)")  # llm.layers.3.q_proj, llm.lm_head
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def pack_awq(values: np.ndarray) -> np.ndarray:
    """[rows, cols] of 0..15 -> int32 [rows, cols / 8] in AutoAWQ's order."""
    rows, cols = values.shape
    grouped = values.astype(np.uint32).reshape(rows, cols // 8, 8)[:, :, AWQ_ORDER]
    packed = np.zeros((rows, cols // 8), np.uint32)
    for i in range(8):
        packed |= grouped[:, :, i] << np.uint32(4 * i)
    return packed.view(np.int32)


def int4_linears(llm: onnx.ModelProto) -> dict[tuple[int, str], dict]:
    """Each MatMulNBits linear by (layer, role), lm_head as (-1, "lm_head"): {q [N, K] 0..15, zeros [N, blocks], scales [N, blocks], block, x (its input
    before any pre-quant Mul), prequant (that Mul's vector or None), output}."""
    inits = {t.name: t for t in llm.graph.initializer}
    producer = {out: node for node in llm.graph.node for out in node.output}
    found = {}
    for node in llm.graph.node:
        m = NODE_NAME.fullmatch(node.name)
        if node.op_type != "MatMulNBits" or m is None:
            continue
        n, k, block = attr(node, "N"), attr(node, "K"), attr(node, "block_size")
        blocks = -(-k // block)
        b = numpy_helper.to_array(inits[node.input[1]])
        q = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(n, blocks * block)[:, :k]
        scales = numpy_helper.to_array(inits[node.input[2]]).astype(np.float32).reshape(n, blocks)
        zeros = np.full((n, blocks), 8, np.uint8)
        if len(node.input) > 3 and node.input[3]:
            zp = numpy_helper.to_array(inits[node.input[3]])
            if zp.dtype != np.uint8:
                raise NotExportable(f"{node.name} has float zero points; AutoAWQ's zeros are 4-bit integers")
            zeros = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)[:, :blocks]
        x, prequant = node.input[0], None
        mul = producer.get(x)
        if mul is not None and mul.op_type == "Mul" and mul.input[1] in inits:
            x, prequant = mul.input[0], numpy_helper.to_array(inits[mul.input[1]]).astype(np.float32)
        found[(int(m.group(1) or -1), m.group(2))] = {"q": q, "zeros": zeros, "scales": scales, "block": block,
                                                      "x": x, "prequant": prequant, "output": node.output[0]}
    return found


def dequantized(lin: dict) -> np.ndarray:
    """The float weight [N, K] the graph applies to the linear's input (pre-quant scale included)."""
    k = lin["q"].shape[1]
    expand = lambda a: np.repeat(a, lin["block"], axis=1)[:, :k]
    w = (lin["q"].astype(np.float32) - expand(lin["zeros"]).astype(np.float32)) * expand(lin["scales"])
    return w if lin["prequant"] is None else w * lin["prequant"][None, :]


def awq_tensors(lin: dict) -> dict[str, np.ndarray]:
    """qweight, qzeros (int32) and scales of one linear, AutoAWQ GEMM's suffixes; the scales in the folder's float32,
    the graph's own values (a loader casts them to the model's dtype)."""
    return {"qweight": pack_awq(lin["q"].T), "qzeros": pack_awq(lin["zeros"].T),
            "scales": lin["scales"].T.astype(np.float32)}


def float_reasons(int4: dict[tuple[int, str], dict], num_layers: int, roles: tuple[str, ...]) -> dict:
    """(layer, role) -> why it is written in float; whole fused units go together."""
    groups = {lin["block"] for lin in int4.values()}
    if len(groups) > 1:
        raise NotExportable(f"the LLM's INT4 linears use several group sizes ({sorted(groups)}); AutoAWQ's config "
                            "has one")
    return units_in_float(int4, num_layers, roles, _awq_reason)


def _awq_reason(lin: dict, role: str) -> str | None:
    if lin["prequant"] is not None:
        return "its input is scaled before the linear (a pre-quant scale)"
    if lin["q"].shape[1] % lin["block"] or lin["q"].shape[0] % 8:
        return "its widths are not whole groups and eights"
    return None


def units_in_float(int4: dict, num_layers: int, roles: tuple[str, ...], reason) -> dict:
    """(layer, role) -> why it is written in float: not INT4 in the bundle, or `reason(lin, role)` says why the
    format cannot hold it; a fused unit (q/k/v, gate/up) goes to float whole when one of its linears does."""
    why = {}
    for layer in range(num_layers):
        for role in roles:
            lin = int4.get((layer, role))
            because = "kept in float by awq_int4" if lin is None else reason(lin, role)
            if because:
                why[(layer, role)] = because
        for unit in FUSED:
            reasons = [why[(layer, r)] for r in unit if (layer, r) in why]
            why |= {(layer, r): why.get((layer, r), f"fused with a float one ({reasons[0]})") for r in unit if reasons}
    return why
