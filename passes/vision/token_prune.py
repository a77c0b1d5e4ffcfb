"""token_prune: hand the LLM fewer image tokens, chosen by a criterion (passes/vision/token_criteria.py).

Every LLM layer and the KV cache pay for every image token, so choosing tokens between the vision encoder and the
LLM saves prefill time and memory in proportion (FasterVLM, VisionZip). The choice is written into the vision graph
in standard ONNX ops that ONNX Runtime and TensorRT both run: a score per token, TopK, the kept indices sorted so
spatial order is kept, and a GatherND on the projector's input, so the projector too runs on the kept tokens only.

With `merge: contextual` the dropped tokens are averaged into a few contextual tokens by key similarity (VisionZip).
With `budget: dynamic` each image keeps the fewest top-ranked tokens whose share of its total score reaches `mass`,
clamped to [min, max]: the output is a block of `max` tokens, the kept ones first in spatial order, plus
`image_token_count` [num_images]; a bounded shape with a count, which TensorRT segments can express. The vision
output contract and the model facts shrink to the kept count (`max` when dynamic), so the sequence profiles, the KV
capacity and the runtime's placeholder expansion follow; `plan_facts` gives that count at plan time. On an
any-resolution model (LLaVA-NeXT, OneVision) the choice is per tile, and an image takes its tiles' kept tokens
one tile after another (base first, no grid layout, no newline), so its count is (1 + tiles) x the kept count.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from mmtrt.errors import UserError
from mmtrt.ir.facts import item_tokens, with_item_tokens
from mmtrt.ir.graph import ModelIR, graph_io
from mmtrt.ir.rewrite import cleanup, producers
from mmtrt.pipeline.pass_base import Pass
from passes.vision.token_criteria import ATTENTION_CRITERIA, Builder, Facts, attention_node, encoder_layer, saliency
from passes.vision.token_criteria import scores as criterion
from passes.vision.token_prune_config import TokenPruneConfig

# VisionZip's split of a 64-token budget: 54 dominant and 10 contextual tokens.
CONTEXTUAL_SHARE = 10 / 64
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
COUNT_OUTPUT = "image_token_count"


@dataclass(frozen=True)
class Budget:
    """What a configuration means for one model: token counts and the encoder layer that is read."""

    tokens: int  # image tokens the vision component yields before the pass
    kept: int  # image tokens after it, dominant + contextual; the padded block's size when dynamic
    contextual: int
    layer: int  # encoder layer, 0-based, whose Attention inputs are read
    cls: int  # 1 when token 0 of the tower is a [CLS] that LLaVA's feature select drops
    reads_attention: bool  # scores or merge read the layer's Attention inputs
    mass: float | None = None  # dynamic only: the share of the total score to reach
    least: int = 1  # dynamic only: the fewest tokens kept

    @property
    def dominant(self) -> int:
        return self.kept - self.contextual

    @property
    def dropped(self) -> int:
        return self.tokens - self.dominant


def plan_budget(config: TokenPruneConfig, vision: dict[str, Any]) -> Budget:
    """Resolve the configuration against the model facts; refuse what cannot apply, naming the fix."""
    tokens = item_tokens(vision)
    cls = int(vision["select_strategy"] == "default")
    if config.method == "cls_attention" and not cls:
        raise UserError(f"method cls_attention needs a vision tower with a [CLS] token that LLaVA drops "
                        f"(vision_feature_select_strategy 'default'); this {vision['model_type']} tower uses "
                        f"'{vision['select_strategy']}'; use method: norm")
    layer = encoder_layer(config.layer, vision)
    if config.budget == "dynamic":
        most = config.max or tokens
        if not (config.min or 1) <= most <= tokens:
            raise UserError(f"min {config.min or 1} and max {most} do not fit the {tokens} image tokens the vision "
                            f"component yields; give 1 <= min <= max <= {tokens}")
        return Budget(tokens, most, 0, layer, cls, config.method in ATTENTION_CRITERIA, config.mass, config.min or 1)
    kept = config.keep if isinstance(config.keep, int) else max(1, round(config.keep * tokens))
    if kept > tokens:
        raise UserError(f"keep {config.keep} asks for more than the {tokens} image tokens the vision component "
                        f"yields; keep at most {tokens}, or give a ratio")
    contextual = 0
    if config.merge == "contextual" and kept < tokens:
        contextual = config.contextual_tokens or max(1, round(kept * CONTEXTUAL_SHARE))
        if contextual >= kept:
            raise UserError(f"merge: contextual with {contextual} contextual tokens leaves no dominant token of the "
                            f"{kept} kept; lower contextual_tokens or raise keep")
    reads_attention = config.method in ATTENTION_CRITERIA or contextual > 0
    return Budget(tokens, kept, contextual, layer, cls, reads_attention)


class TokenPrune(Pass):
    name = "token_prune"
    Config = TokenPruneConfig
    components = ("vision",)
    provides = frozenset({"vision.tokens_pruned"})
    lossy = True

    def plan_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(facts)
        out["vision"] = with_item_tokens(facts["vision"], plan_budget(self.config, facts["vision"]).kept)
        return out

    def run(self, ir: ModelIR) -> dict:
        budget = plan_budget(self.config, ir.config["vision"])
        report = {"method": self.config.method, "merge": self.config.merge, "tokens_before": budget.tokens,
                  "tokens_after": budget.kept, "contextual_tokens": budget.contextual}
        if budget.mass is not None:
            report.update(budget="dynamic", mass=budget.mass, min=budget.least, max=budget.kept)
        elif budget.kept == budget.tokens:
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
    facts = Facts(model)
    if facts.shape(features)[1] != budget.tokens:
        raise ValueError(f"projector input {features} has {facts.shape(features)[1]} tokens, not {budget.tokens}")
    stale = _downstream(graph, features)
    b = Builder(graph)
    attention = attention_node(graph, budget.layer, budget.tokens, budget.cls, facts) if budget.reads_attention \
        else None
    if config.method == "saliency":
        scores = saliency(b, model, config.saliency_model, budget.tokens)
    else:
        scores = criterion(b, config.method, features, attention, facts, budget.tokens, budget.cls, config.seed)
    if budget.mass is not None:
        projector.input[0], count = _select_dynamic(b, features, scores, budget)
        graph.output.append(helper.make_tensor_value_info(COUNT_OUTPUT, INT64, [graph.output[0].type.tensor_type
                                                                                .shape.dim[0].dim_param]))
        b.graph.node.append(helper.make_node("Identity", [count], [COUNT_OUTPUT], name=f"{COUNT_OUTPUT}/identity"))
    else:
        keys = _unit_keys(b, attention, budget) if budget.contextual else None
        projector.input[0] = _select(b, features, scores, keys, budget)
    _forget_shapes(graph, stale)
    graph.output[0].type.tensor_type.shape.dim[1].dim_value = budget.kept
    return cleanup(model)


def _select_dynamic(b: Builder, features: str, scores: str, budget: Budget) -> tuple[str, str]:
    """Per image, count = the fewest top scores whose sum reaches mass x the total, clamped to [least, kept]; the
    block holds the top `kept` tokens with the first `count` of them sorted to the front in spatial order (the rest,
    whatever they hold, the runtime never reads). Returns the block [n, kept, d] and the counts [n]."""
    values, order = b.topk(scores, budget.tokens)
    reached = b.op("CumSum", [values, b.const(np.int64(1))])
    target = b.op("Mul", [b.op("ReduceSum", [values, b.const([1])], keepdims=1), b.const(np.float32(budget.mass))])
    short = b.op("ReduceSum", [b.op("Cast", [b.op("Less", [reached, target])], to=INT64), b.const([1])], keepdims=0)
    count = b.op("Max", [b.op("Min", [b.op("Add", [short, b.const(np.int64(1))]), b.const(np.int64(budget.kept))]),
                         b.const(np.int64(budget.least))])
    top = b.slice(order, 0, budget.kept, axis=1)
    slots = np.arange(budget.kept, dtype=np.int64)
    kept = b.op("Less", [b.const(slots), b.op("Unsqueeze", [count, b.const([1])])])
    ranked = b.op("Where", [kept, top, b.const(slots + budget.tokens)])
    index = b.op("Min", [_ascending(b, ranked, budget.kept), b.const(np.int64(budget.tokens - 1))])
    return _gather(b, features, index), count


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


def _unit_keys(b: Builder, node: onnx.NodeProto, budget: Budget) -> str:
    """VisionZip's similarity metric: per token, the layer's key averaged over heads, at unit length."""
    keys = b.op("ReduceMean", [b.op("Cast", [node.input[1]], to=FLOAT), b.const([1])], keepdims=0)
    keys = b.slice(keys, budget.cls, budget.tokens + budget.cls, axis=1)
    return b.op("Div", [keys, b.op("ReduceL2", [keys, b.const([2])], keepdims=1)])


def _select(b: Builder, features: str, scores: str, keys: str | None, budget: Budget) -> str:
    """The kept tokens, in spatial order, followed by the contextual tokens when merging."""
    if not budget.contextual:
        return _gather(b, features, _ascending(b, b.topk(scores, budget.kept)[1], budget.kept))
    order = b.topk(scores, budget.tokens)[1]
    dominant = _ascending(b, b.slice(order, 0, budget.dominant, axis=1), budget.dominant)
    rest = _ascending(b, b.slice(order, budget.dominant, budget.tokens, axis=1), budget.dropped)
    return b.op("Concat", [_gather(b, features, dominant), _contextual(b, features, keys, rest, budget)], axis=1)


def _contextual(b: Builder, features: str, keys: str, rest: str, budget: Budget) -> str:
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


def _ascending(b: Builder, indices: str, count: int) -> str:
    """Indices sorted ascending (TopK of the smallest), so kept tokens keep their spatial order."""
    return b.topk(indices, count, largest=0)[0]


def _gather(b: Builder, data: str, indices: str) -> str:
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


