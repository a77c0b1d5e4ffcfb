"""Plugin nodes and the local functions that decompose them.

A fused node is `mmtrt.<Name>` with the plugin's attributes plus plugin_namespace / plugin_version / aot, so
TensorRT's ONNX parser imports it as the registered plugin (a node with plugin_namespace whose plugin is in the
registry is imported as that plugin before any other importer is tried). The model also carries a local function
of the same domain and name whose body is the standard-op decomposition: ONNX Runtime inlines it, so a bundle with
plugin nodes still runs on any CPU, and the ONNX checker and shape inference see through it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from mmtrt.ir.rewrite import import_domain
from mmtrt.kernels.catalog import CONTROL_ATTRIBUTES, DOMAIN, NAMESPACE, PLUGINS, PluginSpec

INT64_MAX = np.iinfo(np.int64).max


def plugin_node(spec: PluginSpec, inputs: list[str], output: str | list[str], name: str,
                **attributes) -> onnx.NodeProto:
    if sorted(attributes) != sorted(spec.attributes):
        raise ValueError(f"{spec.name} takes attributes {spec.attributes}, got {sorted(attributes)}")
    outputs = [output] if isinstance(output, str) else output
    return helper.make_node(spec.name, inputs, outputs, name=name, domain=DOMAIN, **attributes,
                            plugin_namespace=NAMESPACE, plugin_version=spec.version, aot=1)


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _ref_const(name: str, kind: str, attribute: str) -> onnx.NodeProto:
    """A Constant whose value is the calling node's attribute (value_int / value_float = @attribute)."""
    node = helper.make_node("Constant", [], [name])
    attr_type = AttributeProto.INT if kind == "value_int" else AttributeProto.FLOAT
    node.attribute.append(helper.make_attribute_ref(kind, attr_type, ref_attr_name=attribute))
    return node


def _token_select_body() -> tuple[list[str], list[str], list[onnx.NodeProto]]:
    """token_prune's cls_attention selection without merge, scored in fp32."""
    n = helper.make_node
    nodes = [
        n("Cast", ["q"], ["qf"], to=TensorProto.FLOAT), n("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
        _const("zero", [0]), _const("one", [1]), _const("two", [2]), _const("heads_and_query", [1, 2]),
        _const("to_end", [INT64_MAX]), _const("vector", [1]),
        n("Slice", ["qf", "zero", "one", "two"], ["q_cls"]),
        n("Transpose", ["kf"], ["k_t"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q_cls", "k_t"], ["dots"]),
        _ref_const("scale", "value_float", "scale"),
        n("Mul", ["dots", "scale"], ["logits"]),
        n("Softmax", ["logits"], ["weights"], axis=-1),
        n("ReduceMean", ["weights", "heads_and_query"], ["mean"], keepdims=0),
        _ref_const("cls0", "value_int", "cls"), n("Reshape", ["cls0", "vector"], ["cls"]),
        n("Slice", ["mean", "cls", "to_end", "one"], ["scores"]),
        _ref_const("keep0", "value_int", "keep"), n("Reshape", ["keep0", "vector"], ["keep"]),
        n("TopK", ["scores", "keep"], ["top_scores", "top"], axis=-1, largest=1, sorted=1),
        n("TopK", ["top", "keep"], ["kept", "kept_order"], axis=-1, largest=0, sorted=1),
        n("Unsqueeze", ["kept", "two"], ["kept_rows"]),
        n("GatherND", ["features", "kept_rows"], ["selected"], batch_dims=1),
    ]
    return ["q", "k", "features"], ["selected"], nodes


def _token_select_merge_body() -> tuple[list[str], list[str], list[onnx.NodeProto]]:
    """token_prune's cls_attention selection with VisionZip's merge: the graph token_prune writes, with the
    counts from the node's attributes and the target / merged positions as inputs."""
    n = helper.make_node
    _, _, scoring = _token_select_body()
    scoring = scoring[:scoring.index(next(x for x in scoring if x.op_type == "TopK"))]  # up to the scores

    def gather_rows(data: str, indices: str, out: str) -> list[onnx.NodeProto]:
        return [n("Unsqueeze", [indices, "two"], [f"{out}_rows"]), n("GatherND", [data, f"{out}_rows"], [out], batch_dims=1)]

    nodes = [
        *scoring,
        n("Shape", ["scores"], ["tokens"], start=1, end=2),
        _ref_const("contextual0", "value_int", "contextual"), n("Reshape", ["contextual0", "vector"], ["contextual"]),
        n("Sub", ["keep", "contextual"], ["dominant"]), n("Sub", ["tokens", "dominant"], ["dropped"]),
        n("TopK", ["scores", "tokens"], ["sorted_scores", "order"], axis=-1, largest=1, sorted=1),
        n("Slice", ["order", "zero", "dominant", "one"], ["order_dominant"]),
        n("TopK", ["order_dominant", "dominant"], ["dominant_idx", "dominant_order"], axis=-1, largest=0, sorted=1),
        n("Slice", ["order", "dominant", "to_end", "one"], ["order_rest"]),
        n("TopK", ["order_rest", "dropped"], ["rest", "rest_order"], axis=-1, largest=0, sorted=1),
        n("ReduceMean", ["kf", "one"], ["head_keys"], keepdims=0),
        n("Slice", ["head_keys", "cls", "to_end", "one"], ["patch_keys"]),
        n("ReduceL2", ["patch_keys", "two"], ["key_norms"], keepdims=1),
        n("Div", ["patch_keys", "key_norms"], ["keys"]),
        n("Gather", ["rest", "target_at"], ["targets"], axis=1),
        n("Gather", ["rest", "merged_at"], ["merged"], axis=1),
        *gather_rows("keys", "targets", "target_keys"), n("Transpose", ["target_keys"], ["target_keys_t"], perm=[0, 2, 1]),
        *gather_rows("keys", "merged", "merged_keys"),
        n("MatMul", ["merged_keys", "target_keys_t"], ["similarity"]),
        n("ArgMax", ["similarity"], ["nearest"], axis=2, keepdims=1),
        _const("start", 0), _const("step", 1), n("Squeeze", ["contextual"], ["contextual_scalar"]),
        n("Range", ["start", "contextual_scalar", "step"], ["target_ids"]),
        n("Equal", ["nearest", "target_ids"], ["joined"]),
        n("CastLike", ["joined", "features"], ["joined_f"]), n("Transpose", ["joined_f"], ["assign"], perm=[0, 2, 1]),
        *gather_rows("features", "merged", "merged_rows"),
        n("MatMul", ["assign", "merged_rows"], ["sums"]),
        _const("one_f", np.float32(1)), n("CastLike", ["one_f", "features"], ["one_like"]),
        n("ReduceSum", ["assign", "two"], ["joined_count"], keepdims=1), n("Max", ["joined_count", "one_like"], ["counts"]),
        *gather_rows("features", "targets", "target_rows"),
        n("Div", ["sums", "counts"], ["means"]), n("Add", ["target_rows", "means"], ["contextual_rows"]),
        *gather_rows("features", "dominant_idx", "dominant_rows"),
        n("Concat", ["dominant_rows", "contextual_rows"], ["selected"], axis=1),
    ]
    return ["q", "k", "features", "target_at", "merged_at"], ["selected"], nodes


def _token_select_scored_body() -> tuple[list[str], list[str], list[onnx.NodeProto]]:
    """token_prune's fixed selection from fp32 scores: TopK, the kept indices ascending, the gather."""
    n = helper.make_node
    nodes = [
        _const("two", [2]), _const("vector", [1]),
        _ref_const("keep0", "value_int", "keep"), n("Reshape", ["keep0", "vector"], ["keep"]),
        n("TopK", ["scores", "keep"], ["top_scores", "top"], axis=-1, largest=1, sorted=1),
        n("TopK", ["top", "keep"], ["kept", "kept_order"], axis=-1, largest=0, sorted=1),
        n("Unsqueeze", ["kept", "two"], ["kept_rows"]),
        n("GatherND", ["features", "kept_rows"], ["selected"], batch_dims=1),
    ]
    return ["scores", "features"], ["selected"], nodes


def _token_select_dynamic_body() -> tuple[list[str], list[str], list[onnx.NodeProto]]:
    """token_prune's dynamic selection (passes/vision/token_prune._select_dynamic) from fp32 scores, the bounds
    from the node's attributes; the count leaves as int32, the plugin's output type."""
    n = helper.make_node
    nodes = [
        _const("zero", [0]), _const("one", [1]), _const("two", [2]), _const("vector", [1]),
        _const("axis", np.int64(1)), _const("first", np.int64(0)), _const("step", np.int64(1)),
        _ref_const("most", "value_int", "most"), n("Reshape", ["most", "vector"], ["most_vec"]),
        _ref_const("least", "value_int", "least"), _ref_const("mass", "value_float", "mass"),
        n("Shape", ["scores"], ["tokens"], start=1, end=2),
        n("TopK", ["scores", "tokens"], ["values", "order"], axis=-1, largest=1, sorted=1),
        n("CumSum", ["values", "axis"], ["reached"]),
        n("ReduceSum", ["values", "one"], ["total"], keepdims=1), n("Mul", ["total", "mass"], ["target"]),
        n("Less", ["reached", "target"], ["short"]), n("Cast", ["short"], ["short_i"], to=TensorProto.INT64),
        n("ReduceSum", ["short_i", "one"], ["shortfall"], keepdims=0),
        n("Add", ["shortfall", "step"], ["reaching"]), n("Min", ["reaching", "most"], ["capped"]),
        n("Max", ["capped", "least"], ["count64"]),
        n("Slice", ["order", "zero", "most_vec", "one"], ["top"]),
        n("Range", ["first", "most", "step"], ["slots"]),
        n("Unsqueeze", ["count64", "one"], ["count_col"]), n("Less", ["slots", "count_col"], ["kept"]),
        n("Add", ["slots", "tokens"], ["past_end"]), n("Where", ["kept", "top", "past_end"], ["ranked"]),
        n("TopK", ["ranked", "most_vec"], ["ascending", "ascending_order"], axis=-1, largest=0, sorted=1),
        n("Sub", ["tokens", "one"], ["last"]), n("Min", ["ascending", "last"], ["index"]),
        n("Unsqueeze", ["index", "two"], ["rows"]),
        n("GatherND", ["features", "rows"], ["selected"], batch_dims=1),
        n("Cast", ["count64"], ["count"], to=TensorProto.INT32),
    ]
    return ["scores", "features"], ["selected", "count"], nodes


def _int4_gemm_body() -> tuple[list[str], list[str], list[onnx.NodeProto]]:
    """(x * pre) @ CastLike(DequantizeLinear(W, scales), x), the block size from group_size: the graph awq_int4
    and cast_precision leave, with W unpacked from the plugin's int8 pairs back to INT4 first (signed nibbles:
    (b & 15) ^ 8 - 8 and ((b & 240) / 16) ^ 8 - 8 of each byte b, interleaved along N)."""
    n = helper.make_node
    dq = n("DequantizeLinear", ["q4", "scales"], ["w"], axis=0)
    dq.attribute.append(helper.make_attribute_ref("block_size", AttributeProto.INT, ref_attr_name="group_size"))
    nodes = [
        _const("low_bits", np.int32(15)), _const("high_bits", np.int32(240)), _const("sign", np.int32(8)),
        _const("nibble", np.int32(16)), _const("last", [-1]), _const("rows_by_columns", [0, -1]),
        n("Cast", ["weight"], ["bytes"], to=TensorProto.INT32),
        n("BitwiseAnd", ["bytes", "low_bits"], ["low_u"]), n("BitwiseXor", ["low_u", "sign"], ["low_x"]),
        n("Sub", ["low_x", "sign"], ["low"]),
        n("BitwiseAnd", ["bytes", "high_bits"], ["high_shifted"]), n("Div", ["high_shifted", "nibble"], ["high_u"]),
        n("BitwiseXor", ["high_u", "sign"], ["high_x"]), n("Sub", ["high_x", "sign"], ["high"]),
        n("Unsqueeze", ["low", "last"], ["low_col"]), n("Unsqueeze", ["high", "last"], ["high_col"]),
        n("Concat", ["low_col", "high_col"], ["pairs"], axis=-1),
        n("Reshape", ["pairs", "rows_by_columns"], ["q"]), n("Cast", ["q"], ["q4"], to=TensorProto.INT4),
        dq, n("CastLike", ["w", "x"], ["w_x"]), n("Mul", ["x", "pre"], ["xs"]), n("MatMul", ["xs", "w_x"], ["y"]),
    ]
    return ["x", "weight", "scales", "pre"], ["y"], nodes


BODIES = {"token_select": _token_select_body, "token_select_merge": _token_select_merge_body,
          "token_select_scored": _token_select_scored_body, "token_select_dynamic": _token_select_dynamic_body,
          "int4_gemm": _int4_gemm_body}


def add_function(model: onnx.ModelProto, key: str) -> None:
    """Give the model the plugin's local function (once) and the opset import of its domain."""
    spec = PLUGINS[key]
    if any(f.domain == DOMAIN and f.name == spec.name for f in model.functions):
        return
    inputs, outputs, nodes = BODIES[key]()
    onnx_opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    model.functions.append(helper.make_function(
        DOMAIN, spec.name, inputs, outputs, nodes, [helper.make_opsetid("", onnx_opset)],
        attributes=[*spec.attributes, *CONTROL_ATTRIBUTES], doc_string=spec.why))
    import_domain(model, DOMAIN)
