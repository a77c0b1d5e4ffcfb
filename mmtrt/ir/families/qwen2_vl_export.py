"""Lower Qwen2-VL and Qwen2.5-VL into ONNX: the vision tower (2-D rotary, window attention in 2.5) and the
M-RoPE decoder.

The vision graph takes one image's flattened patches `[patches, C*T*P*P]` as the processor lays them out, and
integer indices the runtime derives from the image's grid: `patch_pos [patches, 2]` (each patch's row and
column, block-major over the 2x2 merge blocks, as transformers' `get_vision_position_ids`), and for 2.5 the
window order of the merge blocks `window_index [tokens]`, its inverse `window_reverse [tokens]` and each
reordered patch's window `window_id [patches]`. Every float operation (patch embedding, the rotary angles and
their cos/sin, attention, the merger) is in the graph; only integer index arithmetic is left outside, because it
depends on the grid's values, not only on its size. A graph whose shapes follow its inputs' shapes alone is what
a TensorRT profile over `patches` can build; the index arithmetic is exact in numpy and C++ alike.

transformers splits attention by `cu_seqlens` with a Python loop; here a window layer is one `Attention` with a
boolean mask `window_id[i] == window_id[j]` (the mask equals the split: tokens attend within their window), and
a full layer has no mask (one image per call: one segment). The decoder takes `position_ids [3, batch, seq]`
(temporal, height, width): the rotary angles and their M-RoPE sections are computed in the graph.
"""

from __future__ import annotations

import onnx
import torch
from onnx import helper
from torch.export import Dim

from mmtrt.ir import source_weights
from mmtrt.ir.export import DecoderWithCache, _export, kv_names, with_logits_from
from mmtrt.ir.rewrite import attr

WINDOW_INPUTS = ("window_index", "window_reverse", "window_id")


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class VisionTower(torch.nn.Module):
    """transformers' vision forward for one image, its index arithmetic taken as inputs."""

    def __init__(self, model, windowed: bool):
        super().__init__()
        self.visual = model.model.visual
        self.windowed = windowed
        self.unit = self.visual.spatial_merge_size ** 2
        self.full_layers = set(getattr(self.visual, "fullatt_block_indexes", None) or [])

    def _cos_sin(self, patch_pos, like):
        cos, sin = self.visual.rotary_pos_emb(like, patch_pos)
        return cos[:, None, :].float(), sin[:, None, :].float()

    def _reorder(self, x, index):
        """x's rows grouped by merge block, the blocks taken in `index` order."""
        return x.reshape(-1, self.unit, x.shape[-1])[index].reshape(-1, x.shape[-1])

    def _attention(self, attn, x, cos, sin, mask):
        qkv = attn.qkv(x).reshape(x.shape[0], 3, attn.num_heads, -1).permute(1, 0, 2, 3)
        q, k, v = qkv[0].float(), qkv[1].float(), qkv[2]
        q = (q * cos + _rotate_half(q) * sin).to(v.dtype).transpose(0, 1)[None]
        k = (k * cos + _rotate_half(k) * sin).to(v.dtype).transpose(0, 1)[None]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v.transpose(0, 1)[None], attn_mask=mask,
                                                               scale=attn.scaling)
        return attn.proj(out[0].transpose(0, 1).reshape(x.shape[0], -1))

    def forward(self, pixel_values, patch_pos, window_index=None, window_reverse=None, window_id=None):
        x = self.visual.patch_embed(pixel_values)
        cos, sin = self._cos_sin(patch_pos, x)
        window_mask = None
        if self.windowed:
            x = self._reorder(x, window_index)
            cos, sin = (self._reorder(t[:, 0], window_index)[:, None] for t in (cos, sin))
            window_mask = (window_id[:, None] == window_id[None, :])[None, None]  # 4-D, as TensorRT takes it
        for i, block in enumerate(self.visual.blocks):
            mask = window_mask if self.windowed and i not in self.full_layers else None
            x = x + self._attention(block.attn, block.norm1(x), cos, sin, mask)
            x = x + block.mlp(block.norm2(x))
        merged = self.visual.merger(x)
        if self.windowed:
            merged = merged[window_reverse]
        return merged[None]


def export_vision(model, windowed: bool, grid: tuple[int, int]) -> onnx.ModelProto:
    """The tower on a non-square example grid; `patches` is 4 x `tokens` (the 2x2 merge), named in the graph."""
    from mmtrt.runtime.qwen2_vl import vision_indices

    unit = model.config.vision_config.spatial_merge_size ** 2
    cpp = model.model.visual.patch_embed.proj.weight[0].numel()
    indices = vision_indices((1, *grid), model.config.vision_config.to_dict())
    tokens = Dim("tokens", min=1, max=65536)
    args = [torch.randn(grid[0] * grid[1], cpp), torch.from_numpy(indices["patch_pos"])]
    dims = {"pixel_values": {0: unit * tokens}, "patch_pos": {0: unit * tokens}}
    names = ["pixel_values", "patch_pos"]
    if windowed:
        args += [torch.from_numpy(indices[n]) for n in WINDOW_INPUTS]
        dims.update(window_index={0: tokens}, window_reverse={0: tokens}, window_id={0: unit * tokens})
        names += list(WINDOW_INPUTS)
    module = VisionTower(model, windowed).eval()
    return linears_as_matmul(name_patch_dim(_export(module, tuple(args), dims, names, ["image_features"]), unit))


def linears_as_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """The tower runs on 2-D rows, so the exporter writes its linears as Gemm (transB); as MatMul with the weight
    `[K, N]` and an Add of the bias, they take the form of the LLM's, which the weight passes (awq_int4,
    channel_prune) read and TensorRT takes alike."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    for position, gemm in reversed(list(enumerate(graph.node))):
        weight = inits.get(gemm.input[1]) if gemm.op_type == "Gemm" else None
        scaled = attr(gemm, "alpha", 1.0) != 1.0 or attr(gemm, "beta", 1.0) != 1.0
        if weight is None or attr(gemm, "transA", 0) or scaled:
            continue
        if attr(gemm, "transB", 0):
            weight.CopyFrom(source_weights.transposed(weight))
            stale = [v for v in graph.value_info if v.name == weight.name]  # the exporter's [N, K]
            for value in stale:
                graph.value_info.remove(value)
        out = gemm.output[0]
        nodes = [helper.make_node("MatMul", gemm.input[:2], [f"{out}.matmul" if len(gemm.input) > 2 else out],
                                  name=f"{gemm.name}.matmul")]
        if len(gemm.input) > 2:
            nodes.append(helper.make_node("Add", [f"{out}.matmul", gemm.input[2]], [out], name=f"{gemm.name}.bias"))
            shaped = next((v for v in graph.value_info if v.name == out), None)
            if shaped is not None:  # the shape plan sizes segment boundaries from these
                graph.value_info.append(helper.make_value_info(f"{out}.matmul", shaped.type))
        graph.node.remove(gemm)
        for offset, node in enumerate(nodes):
            graph.node.insert(position + offset, node)
    return model


def name_patch_dim(model: onnx.ModelProto, unit: int) -> onnx.ModelProto:
    """The exporter names a derived dimension by its expression (`4*tokens`); the IR names it `patches`."""
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param.replace(" ", "") == f"{unit}*tokens":
                d.dim_param = "patches"
    return model


def export_decoder(model, num_layers: int, kv_heads: int, head_dim: int, hidden: int) -> onnx.ModelProto:
    """LLaVA's decoder wrapper (the same module paths), its position_ids `[3, batch, seq]`."""
    batch, seq, past_len = 2, 5, 3
    batch_dim, seq_dim = Dim("batch", min=1, max=64), Dim("seq", min=1, max=65536)
    past_dim, total_dim = Dim("past", min=0, max=65536), Dim("total", min=1, max=131072)
    positions = torch.stack([torch.arange(past_len, past_len + seq), torch.arange(seq) + 7, torch.arange(seq) * 2])
    example = (
        torch.randn(batch, seq, hidden),
        torch.ones(batch, past_len + seq, dtype=torch.int64),
        positions[:, None, :].repeat(1, batch, 1),
        [torch.randn(batch, kv_heads, past_len, head_dim) for _ in range(2 * num_layers)],
    )
    dims = {
        "inputs_embeds": {0: batch_dim, 1: seq_dim},
        "attention_mask": {0: batch_dim, 1: total_dim},
        "position_ids": {1: batch_dim, 2: seq_dim},
        "past": [{0: batch_dim, 2: past_dim}] * (2 * num_layers),
    }
    inputs = ["inputs_embeds", "attention_mask", "position_ids", *kv_names(num_layers, "past")]
    outputs = ["logits", *kv_names(num_layers, "present")]
    return with_logits_from(_export(DecoderWithCache(model).eval(), example, dims, inputs, outputs))
