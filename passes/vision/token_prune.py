"""token_prune: hand the LLM fewer image tokens, chosen by [CLS] attention, feature norm or at random.

Every LLM layer and the KV cache pay for every image token, so choosing tokens between the vision encoder and the
LLM saves prefill time and memory in proportion (FasterVLM, VisionZip). The choice is written into the vision graph
in standard ONNX ops that ONNX Runtime and TensorRT both run: a score per token, TopK, the kept indices sorted so
spatial order is kept, and a GatherND on the projector's input, so the projector too runs on the kept tokens only.

`cls_attention` scores a patch by the attention [CLS] pays it at one encoder layer, mean over heads, computed as
softmax(q_cls K^T) from that layer's Attention inputs (O(H N d), no N x N map); `norm` by the L2 norm of its
feature before the projector; `random` by a fixed-seed draw, the baseline a criterion must beat. With
`merge: contextual` the dropped tokens are averaged into a few contextual tokens by key similarity (VisionZip).
The vision output contract and the model facts shrink to the kept count, so the sequence profiles, the KV
capacity and the runtime's placeholder expansion follow; `plan_facts` gives that count at plan time.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from pydantic import Field, model_validator

from mmtrt.errors import UserError
from mmtrt.ir.flops import concrete
from mmtrt.ir.graph import ModelIR, graph_io
from mmtrt.ir.rewrite import attr, cleanup, producers
from mmtrt.pipeline.pass_base import Pass, PassConfig

PREFIX = "token_prune"
# VisionZip's split of a 64-token budget: 54 dominant and 10 contextual tokens.
CONTEXTUAL_SHARE = 10 / 64
FLOAT = TensorProto.FLOAT


class TokenPruneConfig(PassConfig):
    keep: int | float = Field(description="Image tokens kept per image: a ratio in (0, 1] of the tokens the vision component yields, or a count (an integer). 1.0 leaves the model unchanged.")
    method: Literal["cls_attention", "norm", "random"] = Field("cls_attention", description="How tokens are scored: `cls_attention` (attention from [CLS] to each patch at `layer`, mean over heads; needs a tower whose [CLS] LLaVA drops), `norm` (L2 norm of each token's feature before the projector; for towers without [CLS]) or `random` (a fixed-seed draw, the baseline).")
    layer: int | None = Field(None, description="Hidden-state index, counted like LLaVA's vision_feature_layer (negative from the end), of the encoder layer whose attention (`cls_attention`) and keys (`merge`) are read; at most the feature layer. Default: the feature layer.")
    merge: Literal["none", "contextual"] = Field("none", description="`contextual`: average the dropped tokens into `contextual_tokens` tokens by key similarity (VisionZip) instead of discarding them; they count within `keep`.")
    contextual_tokens: int | None = Field(None, ge=1, description="`merge: contextual` only: how many of the kept tokens are contextual. Default: 10 in 64 of the kept tokens, as VisionZip splits its budgets.")
    seed: int = Field(0, description="`random` only: the seed of the draw.")

    @model_validator(mode="after")
    def _consistent(self) -> "TokenPruneConfig":
        if isinstance(self.keep, float) and not 0 < self.keep <= 1:
            raise ValueError(f"keep {self.keep} is a ratio outside (0, 1]; write an integer for a token count")
        if isinstance(self.keep, int) and self.keep < 1:
            raise ValueError(f"keep {self.keep} keeps no token; keep at least 1")
        if self.contextual_tokens is not None and self.merge != "contextual":
            raise ValueError("contextual_tokens needs merge: contextual")
        return self


@dataclass(frozen=True)
class Budget:
    """What a configuration means for one model: token counts and the encoder layer that is read."""

    tokens: int  # image tokens the vision component yields before the pass
    kept: int  # image tokens after it, dominant + contextual
    contextual: int
    layer: int  # encoder layer, 0-based, whose Attention inputs are read
    cls: int  # 1 when token 0 of the tower is a [CLS] that LLaVA's feature select drops
    reads_attention: bool  # scores or merge read the layer's Attention inputs

    @property
    def dominant(self) -> int:
        return self.kept - self.contextual

    @property
    def dropped(self) -> int:
        return self.tokens - self.dominant


def plan_budget(config: TokenPruneConfig, vision: dict[str, Any]) -> Budget:
    """Resolve the configuration against the model facts; refuse what cannot apply, naming the fix."""
    tokens = vision["image_tokens"]
    kept = config.keep if isinstance(config.keep, int) else max(1, round(config.keep * tokens))
    if kept > tokens:
        raise UserError(f"keep {config.keep} asks for more than the {tokens} image tokens the vision component "
                        f"yields; keep at most {tokens}, or give a ratio")
    cls = int(vision["select_strategy"] == "default")
    if config.method == "cls_attention" and not cls:
        raise UserError(f"method cls_attention needs a vision tower with a [CLS] token that LLaVA drops "
                        f"(vision_feature_select_strategy 'default'); this {vision['model_type']} tower uses "
                        f"'{vision['select_strategy']}'; use method: norm")
    contextual = 0
    if config.merge == "contextual" and kept < tokens:
        contextual = config.contextual_tokens or max(1, round(kept * CONTEXTUAL_SHARE))
        if contextual >= kept:
            raise UserError(f"merge: contextual with {contextual} contextual tokens leaves no dominant token of the "
                            f"{kept} kept; lower contextual_tokens or raise keep")
    reads_attention = config.method == "cls_attention" or contextual > 0
    return Budget(tokens, kept, contextual, _encoder_layer(config.layer, vision), cls, reads_attention)


def _encoder_layer(layer: int | None, vision: dict[str, Any]) -> int:
    """hidden_states[0] is the embedding and hidden_states[i] the output of encoder layer i - 1."""
    count = vision["num_layers"] + 1
    feature = vision["feature_layer"] % count
    if layer is None:
        return feature - 1
    if not -count <= layer < count or not 1 <= layer % count <= feature:
        raise UserError(f"layer {layer} is not an encoder layer up to the feature layer; give a hidden-state index "
                        f"from 1 to {feature} (or {1 - count} to {feature - count} from the end)")
    return layer % count - 1


class TokenPrune(Pass):
    name = "token_prune"
    Config = TokenPruneConfig
    components = ("vision",)
    provides = frozenset({"vision.tokens_pruned"})
    lossy = True

    def plan_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(facts)
        out["vision"]["image_tokens"] = plan_budget(self.config, facts["vision"]).kept
        return out

    def run(self, ir: ModelIR) -> dict:
        budget = plan_budget(self.config, ir.config["vision"])
        report = {"method": self.config.method, "merge": self.config.merge, "tokens_before": budget.tokens,
                  "tokens_after": budget.kept, "contextual_tokens": budget.contextual}
        if budget.kept == budget.tokens:
            return {**report, "graph_changed": False}
        comp = ir.components["vision"]
        comp.onnx = prune(comp.onnx, budget, self.config)
        comp.outputs = graph_io(comp.onnx, "outputs")
        ir.config = self.plan_facts(ir.config)
        return {**report, "graph_changed": True, "encoder_layer_read": budget.layer if budget.reads_attention else None}


def prune(model: onnx.ModelProto, budget: Budget, config: TokenPruneConfig) -> onnx.ModelProto:
    """Insert the selection between the tower and the projector; the graph output shrinks to the kept tokens."""
    graph = model.graph
    projector = projector_entry(graph)
    features = projector.input[0]
    facts = _Facts(model)
    if facts.shape(features)[1] != budget.tokens:
        raise ValueError(f"projector input {features} has {facts.shape(features)[1]} tokens, not {budget.tokens}")
    stale = _downstream(graph, features)
    b = _Builder(graph)
    attention = _attention(graph, budget, facts) if budget.reads_attention else None
    if config.method == "cls_attention":
        scores = _cls_attention(b, attention, facts, budget)
    elif config.method == "norm":
        scores = b.op("ReduceL2", [b.op("Cast", [features], to=FLOAT), b.const([2])], keepdims=0)
    else:
        scores = _random_scores(b, features, budget.tokens, config.seed)
    keys = _unit_keys(b, attention, budget) if budget.contextual else None
    projector.input[0] = _select(b, features, scores, keys, budget)
    _forget_shapes(graph, stale)
    graph.output[0].type.tensor_type.shape.dim[1].dim_value = budget.kept
    return cleanup(model)


def projector_entry(graph: onnx.GraphProto) -> onnx.NodeProto:
    """The projector's first MatMul. LLaVA's projector is linear, activation, linear: walking back from the output
    along computed inputs, it is the second MatMul met (whatever casts or identities lie between)."""
    made = producers(graph)
    name, matmuls = graph.output[0].name, 0
    while name in made:
        node = made[name]
        if node.op_type == "MatMul":
            matmuls += 1
            if matmuls == 2:
                return node
        name = next((i for i in node.input if i in made and made[i].op_type != "Constant"), None)
    raise ValueError("vision graph: no linear-activation-linear projector found before the output")


class _Facts:
    """Shapes and types of every tensor at one image, from shape inference."""

    def __init__(self, model: onnx.ModelProto):
        inferred = concrete(model, {"num_images": 1})
        values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
        self.types = {v.name: v.type.tensor_type.elem_type for v in values}
        self.shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}

    def shape(self, name: str) -> list[int]:
        return self.shapes[name]


def _attention(graph: onnx.GraphProto, budget: Budget, facts: _Facts) -> onnx.NodeProto:
    """The Attention node of the encoder layer `budget.layer`: layers are a chain, so the n-th in graph order,
    before dead_layer_elimination or after it (which only removes later layers)."""
    nodes = [n for n in graph.node if n.op_type == "Attention"]
    if len(nodes) <= budget.layer:
        raise ValueError(f"vision graph has {len(nodes)} Attention nodes; encoder layer {budget.layer} is missing")
    node = nodes[budget.layer]
    query, key = facts.shape(node.input[0]), facts.shape(node.input[1])
    if attr(node, "is_causal", 0) or attr(node, "softcap", 0.0) or len(query) != 4 or query[1] != key[1]:
        raise UserError("the vision encoder's attention is causal, soft-capped, 3D or grouped, which token_prune "
                        "cannot read scores from; use method: norm without merge")
    if key[2] != budget.tokens + budget.cls:
        raise ValueError(f"encoder layer {budget.layer} attends over {key[2]} tokens, not {budget.tokens + budget.cls}")
    return node


def _cls_attention(b: "_Builder", node: onnx.NodeProto, facts: _Facts, budget: Budget) -> str:
    """Per patch, the attention weight from [CLS] at this layer, mean over heads: [num_images, tokens]."""
    query, key = (b.op("Cast", [name], to=FLOAT) for name in node.input[:2])
    scale = attr(node, "scale") or 1 / math.sqrt(facts.shape(node.input[0])[-1])
    logits = b.op("MatMul", [b.slice(query, 0, 1, axis=2), b.op("Transpose", [key], perm=[0, 1, 3, 2])])
    logits = b.op("Mul", [logits, b.const(np.float32(scale))])
    mask = node.input[3] if len(node.input) > 3 else ""
    if mask:
        logits = _masked(b, logits, b.slice(mask, 0, 1, axis=-2), facts.types[mask])
    weights = b.op("ReduceMean", [b.op("Softmax", [logits], axis=-1), b.const([1, 2])], keepdims=0)
    return b.slice(weights, budget.cls, budget.tokens + budget.cls, axis=1)


def _masked(b: "_Builder", logits: str, mask_row: str, mask_type: int) -> str:
    """Apply the layer's attention mask as the Attention op does: a boolean keeps, a float adds."""
    if mask_type == TensorProto.BOOL:
        return b.op("Where", [mask_row, logits, b.const(np.finfo(np.float32).min)])
    return b.op("Add", [logits, b.op("Cast", [mask_row], to=FLOAT)])


def _random_scores(b: "_Builder", features: str, tokens: int, seed: int) -> str:
    """A fixed draw per token, the same for every image: its top k is a uniformly random k-subset."""
    draw = np.random.default_rng(seed).random(tokens, dtype=np.float32)
    shape = b.op("Concat", [b.op("Shape", [features], end=1), b.const([tokens])], axis=0)
    return b.op("Expand", [b.const(draw), shape])


def _unit_keys(b: "_Builder", node: onnx.NodeProto, budget: Budget) -> str:
    """VisionZip's similarity metric: per token, the layer's key averaged over heads, at unit length."""
    keys = b.op("ReduceMean", [b.op("Cast", [node.input[1]], to=FLOAT), b.const([1])], keepdims=0)
    keys = b.slice(keys, budget.cls, budget.tokens + budget.cls, axis=1)
    return b.op("Div", [keys, b.op("ReduceL2", [keys, b.const([2])], keepdims=1)])


def _select(b: "_Builder", features: str, scores: str, keys: str | None, budget: Budget) -> str:
    """The kept tokens, in spatial order, followed by the contextual tokens when merging."""
    if not budget.contextual:
        return _gather(b, features, _ascending(b, b.topk(scores, budget.kept)[1], budget.kept))
    order = b.topk(scores, budget.tokens)[1]
    dominant = _ascending(b, b.slice(order, 0, budget.dominant, axis=1), budget.dominant)
    rest = _ascending(b, b.slice(order, budget.dominant, budget.tokens, axis=1), budget.dropped)
    return b.op("Concat", [_gather(b, features, dominant), _contextual(b, features, keys, rest, budget)], axis=1)


def _contextual(b: "_Builder", features: str, keys: str, rest: str, budget: Budget) -> str:
    """VisionZip: every step-th dropped token (in spatial order) is a target; every other dropped token joins the
    target with the most similar key; a contextual token is its target plus the mean of the tokens that joined."""
    target_at, merged_at = contextual_targets(budget.dropped, budget.contextual)
    targets = b.op("Gather", [rest, b.const(target_at)], axis=1)
    merged = b.op("Gather", [rest, b.const(merged_at)], axis=1)
    target_keys = b.op("Transpose", [_gather(b, keys, targets)], perm=[0, 2, 1])
    nearest = b.op("ArgMax", [b.op("MatMul", [_gather(b, keys, merged), target_keys])], axis=2, keepdims=1)
    joined = b.op("Equal", [nearest, b.const(np.arange(budget.contextual))])
    assign = b.op("Transpose", [b.op("CastLike", [joined, features])], perm=[0, 2, 1])
    sums = b.op("MatMul", [assign, _gather(b, features, merged)])
    one = b.op("CastLike", [b.const(np.float32(1)), features])
    counts = b.op("Max", [b.op("ReduceSum", [assign, b.const([2])], keepdims=1), one])
    return b.op("Add", [_gather(b, features, targets), b.op("Div", [sums, counts])])


def contextual_targets(dropped: int, contextual: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions, among the dropped tokens in spatial order, of the targets and of the tokens merged into them."""
    targets = np.arange(0, dropped, max(1, dropped // contextual))[:contextual]
    return targets, np.setdiff1d(np.arange(dropped), targets)


def _ascending(b: "_Builder", indices: str, count: int) -> str:
    """Indices sorted ascending (TopK of the smallest), so kept tokens keep their spatial order."""
    return b.topk(indices, count, largest=0)[0]


def _gather(b: "_Builder", data: str, indices: str) -> str:
    """Per image, the rows of data [n, tokens, d] at indices [n, k]."""
    return b.op("GatherND", [data, b.op("Unsqueeze", [indices, b.const([2])])], batch_dims=1)


def _downstream(graph: onnx.GraphProto, name: str) -> set[str]:
    """Tensors computed from `name` (nodes are in topological order)."""
    reached = {name}
    for node in graph.node:
        if reached.intersection(node.input):
            reached.update(node.output)
    return reached - {name}


def _forget_shapes(graph: onnx.GraphProto, names: set[str]) -> None:
    """Drop recorded shapes that counted the old tokens; shape inference recomputes them."""
    kept = [v for v in graph.value_info if v.name not in names]
    del graph.value_info[:]
    graph.value_info.extend(kept)


class _Builder:
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

    def topk(self, data: str, k: int, largest: int = 1) -> list[str]:
        return self.op("TopK", [data, self.const([k])], outputs=2, axis=-1, largest=largest, sorted=1)
