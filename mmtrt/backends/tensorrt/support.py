"""Which ONNX nodes TensorRT's ONNX parser accepts: ops, the types each takes, and the attributes, shapes and
constant inputs it requires.

Source: onnx/onnx-tensorrt docs/operators.md as released with TensorRT 10.15 (opset 9 to 24), the last
operator table published; the TensorRT 11.0 release notes add `Swish` to the parser (no type list given, the
float types are assumed as for `Sigmoid`). Where the table and the parser source disagree we follow the table
(it states what a release supports): e.g. the table requires 4D `Attention` inputs although the importer in
onnxOpImporters.cpp also reshapes 3D ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from mmtrt.ir import source_weights
from mmtrt.ir.rewrite import attr

TABLE_SOURCE = "onnx/onnx-tensorrt docs/operators.md (TensorRT 10.15, opset 9-24) + TensorRT 11.0 release notes (Swish)"
TENSORRT_VERSION = "11"

FP32, FP16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
INT32, INT64, INT8, UINT8, BOOL = TensorProto.INT32, TensorProto.INT64, TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL
FP8, FP4, INT4 = TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT4E2M1, TensorProto.INT4
F = frozenset({FP32, FP16, BF16})
FI = F | {INT32, INT64}
FIB = FI | {BOOL}
HALF = frozenset({FP32, FP16})
CONSTANTS = F | {FP8, FP4, INT4, INT32, INT64, BOOL}
CASTS = FIB | {UINT8}
REDUCE = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
          "ReduceProd", "ReduceSum", "ReduceSumSquare")

# Op -> the types its main tensor may have (the column "Supported Types").
SUPPORTED: dict[str, frozenset[int]] = {
    **dict.fromkeys(["Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "AveragePool", "BatchNormalization", "Ceil",
                     "Celu", "Clip", "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "Dropout", "Einsum", "Elu",
                     "Erf", "Exp", "Floor", "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool",
                     "GroupNormalization", "GRU", "HardSigmoid", "HardSwish", "Hardmax", "ImageScaler",
                     "InstanceNormalization", "IsInf", "LayerNormalization", "LeakyRelu", "Log", "LogSoftmax", "LRN",
                     "LSTM", "LpNormalization", "LpPool", "MatMul", "MaxPool", "MeanVarianceNormalization",
                     "ParametricSoftplus", "PRelu", "QuantizeLinear", "RandomNormal", "RandomNormalLike",
                     "RandomUniform", "RandomUniformLike", "Reciprocal", "Resize", "RMSNormalization", "RNN",
                     "RotaryEmbedding", "Round", "ScaledTanh", "Scan", "Selu", "Sigmoid", "Sin", "Sinh", "Softmax",
                     "Softplus", "Softsign", "Sqrt", "Swish", "Tan", "Tanh", "ThresholdedRelu", "Upsample"], F),
    **dict.fromkeys(["Abs", "Add", "ArgMax", "ArgMin", "DepthToSpace", "Div", "Equal", "Greater", "GreaterOrEqual",
                     "IsNaN", "Less", "LessOrEqual", "Max", "Min", "Mod", "Mul", "Neg", "Pad", "Pow", "Range", "Relu",
                     "Scatter", "ScatterElements", "ScatterND", "Shrink", "Sign", "SpaceToDepth", "Sub", "Sum", "TopK",
                     *REDUCE], FI),
    **dict.fromkeys(["Concat", "Expand", "EyeLike", "Flatten", "Gather", "GatherElements", "GatherND", "Identity", "If",
                     "Loop", "OneHot", "Reshape", "ReverseSequence", "Shape", "Size", "Slice", "Split", "Squeeze",
                     "Tile", "Transpose", "Trilu", "Unsqueeze", "Where"], FIB),
    **dict.fromkeys(["BlackmanWindow", "DeformConv", "GridSample", "HammingWindow", "HannWindow", "Mish",
                     "NonMaxSuppression", "NonZero", "RoiAlign"], HALF),
    **dict.fromkeys(["And", "Not", "Or", "Xor"], frozenset({BOOL})),
    **dict.fromkeys(["Cast", "CastLike"], CASTS),
    **dict.fromkeys(["Constant", "ConstantOfShape"], CONSTANTS),
    "Attention": F | {INT8, FP8},
    "DequantizeLinear": frozenset({INT8, FP8, FP4, INT4}),
    "Gelu": F | {INT8, INT32, INT64},
    "Mean": F | {FP8, INT32, INT64},
    "STFT": frozenset({FP32}),
    "TensorScatter": F | {INT32},
}

# Ops the table lists as unsupported (N); any op absent from both lists is unknown to the parser.
UNSUPPORTED = frozenset({
    "AffineGrid", "Bernoulli", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "Col2Im",
    "CenterCropPad", "Compress", "ConcatFromSequence", "ConvInteger", "DFT", "Det", "DynamicQuantizeLinear",
    "ImageDecoder", "MatMulInteger", "MaxRoiPool", "MaxUnpool", "MelWeightMatrix", "Multinomial",
    "NegativeLogLikelihoodLoss", "Optional", "OptionalGetElement", "OptionalHasElement", "QLinearConv",
    "QLinearMatMul", "RegexFullMatch", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
    "SequenceInsert", "SequenceLength", "SequenceMap", "SoftmaxCrossEntropyLoss", "SplitToSequence", "StringConcat",
    "StringNormalizer", "StringSplit", "TfIdfVectorizer", "Unique",
})

# Which tensor carries the type the table lists: input 0 unless named here ("out" = output 0).
TYPED_TENSOR = {"Where": 1, "Constant": "out", "ConstantOfShape": "out", "RandomNormal": "out",
                "RandomUniform": "out"}
TENSORRT_TYPES = CONSTANTS | {INT8, UINT8}


@dataclass(frozen=True)
class Verdict:
    """Why TensorRT cannot take a node: `kind` is op, attribute, dtype or shape."""

    kind: str
    reason: str


@dataclass
class GraphFacts:
    """What the checks need beyond the node: tensor types and shapes (from shape inference) and constants."""

    types: dict[str, int]
    shapes: dict[str, list]
    constants: dict[str, onnx.TensorProto]

    def value(self, name: str) -> np.ndarray:
        return source_weights.array(self.constants[name])

    def rank(self, name: str) -> int | None:
        shape = self.shapes.get(name)
        return None if shape is None else len(shape)


def check_node(node: onnx.NodeProto, facts: GraphFacts) -> Verdict | None:
    """None when TensorRT's ONNX parser takes the node; otherwise the first reason it does not."""
    if node.domain not in ("", "ai.onnx"):
        return Verdict("op", f"{node.domain}.{node.op_type} is a custom-domain op with no TensorRT plugin declared")
    if node.op_type in UNSUPPORTED:
        return Verdict("op", f"{node.op_type} is not supported by TensorRT's ONNX parser")
    if node.op_type not in SUPPORTED:
        return Verdict("op", f"{node.op_type} is not in TensorRT's ONNX operator table")
    return _check_types(node, facts) or _check_body(node, facts) or _RULES.get(node.op_type, _no_rule)(node, facts)


def _name(dtype: int) -> str:
    return TensorProto.DataType.Name(dtype)


def _check_types(node, facts) -> Verdict | None:
    for name in [*node.input, *node.output]:
        dtype = facts.types.get(name)
        if name and dtype is not None and dtype not in TENSORRT_TYPES:
            return Verdict("dtype", f"tensor {name} is {_name(dtype)}, which TensorRT has no type for")
        if name and dtype == UINT8 and node.op_type not in ("Cast", "CastLike"):
            return Verdict("dtype", f"tensor {name} is UINT8, which TensorRT takes only as network I/O through a Cast")
    where = TYPED_TENSOR.get(node.op_type, 0)
    names = node.output if where == "out" else node.input
    index = 0 if where == "out" else where
    dtype = facts.types.get(names[index]) if len(names) > index and names[index] else None
    if dtype is not None and dtype not in SUPPORTED[node.op_type]:
        return Verdict("dtype", f"{node.op_type} on {_name(dtype)} is not supported (TensorRT takes "
                                f"{', '.join(sorted(_name(t) for t in SUPPORTED[node.op_type]))})")
    if node.op_type == "Cast" and attr(node, "to") not in CASTS:
        return Verdict("dtype", f"Cast to {_name(attr(node, 'to'))} is not supported")
    return None


def _check_body(node, facts) -> Verdict | None:
    """Control flow is supported only if every op of its bodies is (their types are not inferred here)."""
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for graph in graphs:
            for inner in graph.node:
                verdict = check_node(inner, GraphFacts({}, {}, facts.constants))
                if verdict is not None:
                    return Verdict(verdict.kind, f"{node.op_type} body: {verdict.reason}")
    return None


def _no_rule(node, facts) -> None:
    return None


def _given(node, index: int) -> str | None:
    return node.input[index] if len(node.input) > index and node.input[index] else None


def _used_outputs(node) -> int:
    return sum(1 for name in node.output if name)


def _attention(node, facts):
    if _used_outputs(node) > 1:
        return Verdict("attribute", "Attention outputs present_key, present_value and qk_matmul_output are unsupported")
    if any(_given(node, i) for i in (4, 5, 6)):
        return Verdict("attribute", "Attention inputs past_key, past_value and nonpad_kv_seqlen are unsupported")
    if attr(node, "softcap", 0.0) != 0.0 or attr(node, "qk_matmul_output_mode", 0) != 0:
        return Verdict("attribute", "Attention attributes softcap and qk_matmul_output_mode are unsupported")
    for i in range(4):
        name = _given(node, i)
        if name and facts.rank(name) not in (None, 4):
            return Verdict("shape", f"Attention needs 4D Q, K, V and mask; {name} is {facts.rank(name)}D")
    return None


def _first_output_only(node, facts):
    if _used_outputs(node) > 1:
        return Verdict("attribute", f"{node.op_type}: only the first output is supported")
    return None


def _pool(node, facts):
    if any(d != 1 for d in attr(node, "dilations", [])):
        return Verdict("attribute", f"{node.op_type}: dilations must be all ones")
    if node.op_type in ("MaxPool", "AveragePool") and len(attr(node, "kernel_shape", [])) not in (2, 3):
        return Verdict("shape", f"{node.op_type}: only 2D or 3D pooling is supported")
    return _first_output_only(node, facts)


def _constant_input(index: int, what: str):
    def rule(node, facts):
        name = _given(node, index)
        if name and name not in facts.constants:
            return Verdict("attribute", f"{node.op_type}: {what} must be a build-time constant")
        return None
    return rule


def _zero_point(index: int):
    def rule(node, facts):
        name = _given(node, index)
        if name and (name not in facts.constants or np.any(facts.value(name) != 0)):
            return Verdict("attribute", f"{node.op_type}: the zero point must be a constant zero")
        return None
    return rule


# Block sizes TensorRT's blocked (INT4 weight-only) DequantizeLinear takes (REFERENCE.md, TensorRT 10.x/11 docs).
DQ_BLOCK_SIZES = (64, 128)


def _dequantize(node, facts):
    block = attr(node, "block_size", 0)
    if block and block not in DQ_BLOCK_SIZES:
        return Verdict("attribute", f"DequantizeLinear: block_size {block} is not supported (TensorRT takes "
                                    f"{' or '.join(map(str, DQ_BLOCK_SIZES))})")
    if block:
        axis = attr(node, "axis", 1)
        data, scale = facts.shapes.get(node.input[0]), facts.shapes.get(node.input[1])
        k, blocks = (data[axis], scale[axis]) if data and scale and len(data) == len(scale) else (None, None)
        if isinstance(k, int) and isinstance(blocks, int) and (blocks <= 0 or k % blocks):
            # onnx-tensorrt's own words (validateScaleDimensions): the block is K / scale dim, never a partial one
            return Verdict("shape", "DequantizeLinear: The quantization axis must divide into whole blocks. Input "
                                    f"dimension {axis % len(data)} = {k}, scale dimension = {blocks}.")
    return _zero_point(2)(node, facts)


def _dropout(node, facts):
    name = _given(node, 2)
    if name and (name not in facts.constants or bool(facts.value(name))):
        return Verdict("attribute", "Dropout: is_training must be a constant False")
    return None


def _resize(node, facts):
    checks = [
        (attr(node, "antialias", 0) == 0, "antialiasing is not supported"),
        (attr(node, "mode", b"nearest") in (b"nearest", b"linear"), "only nearest and linear modes are supported"),
        (attr(node, "coordinate_transformation_mode", b"half_pixel") in
         (b"half_pixel", b"pytorch_half_pixel", b"tf_half_pixel_for_nn", b"asymmetric", b"align_corners"),
         "unsupported coordinate_transformation_mode"),
        (attr(node, "nearest_mode", b"round_prefer_floor") in
         (b"floor", b"ceil", b"round_prefer_floor", b"round_prefer_ceil"), "unsupported nearest_mode"),
        (attr(node, "keep_aspect_ratio_policy", b"stretch") == b"stretch", "only the stretch aspect ratio policy"),
    ]
    return next((Verdict("attribute", f"Resize: {why}") for ok, why in checks if not ok), None)


def _topk(node, facts):
    if attr(node, "sorted", 1) != 1:
        return Verdict("attribute", "TopK: sorted must be 1")
    name = _given(node, 1)
    if name not in facts.constants:
        return Verdict("attribute", "TopK: K must be a build-time constant")
    k = int(facts.value(name).ravel()[0])
    if k >= 3840:
        return Verdict("attribute", f"TopK: K = {k} must be below 3840")
    return None


def _scatter_nd(node, facts):
    if attr(node, "reduction", b"none") != b"none":
        return Verdict("attribute", "ScatterND: only reduction none is supported")
    return None


def _lstm(node, facts):
    if attr(node, "input_forget", 0) != 0 or attr(node, "layout", 0) != 0:
        return Verdict("attribute", "LSTM: input_forget and layout must be 0")
    return None


def _constant(node, facts):
    if any(a.name in ("sparse_value", "value_string", "value_strings") for a in node.attribute):
        return Verdict("attribute", "Constant: sparse and string values are unsupported")
    return None


def _rotary(node, facts):
    name = _given(node, 3)
    if name and facts.types.get(name, INT64) != INT64:
        return Verdict("dtype", "RotaryEmbedding: position_ids must be INT64")
    return None


def _tensor_scatter(node, facts):
    if attr(node, "axis", -2) != -2:
        return Verdict("attribute", "TensorScatter: axis must be -2")
    if any(facts.rank(n) not in (None, 4) for n in node.input[:2]):
        return Verdict("shape", "TensorScatter: past_cache and update must be 4D")
    return None


def _grid_sample(node, facts):
    if facts.rank(node.input[0]) not in (None, 4):
        return Verdict("shape", "GridSample: the input must be 4D")
    return None


def _eye_like(node, facts):
    shape = facts.shapes.get(node.input[0])
    if shape is not None and not all(isinstance(d, int) for d in shape):
        return Verdict("shape", "EyeLike: the input must have static dimensions")
    return None


_RULES = {
    "Attention": _attention,
    "LayerNormalization": _first_output_only,
    "MaxPool": _pool, "AveragePool": _pool, "LpPool": _pool,
    "Dropout": _dropout,
    "Resize": _resize,
    "TopK": _topk,
    "ScatterND": _scatter_nd,
    "LSTM": _lstm,
    "Constant": _constant,
    "RotaryEmbedding": _rotary,
    "TensorScatter": _tensor_scatter,
    "GridSample": _grid_sample,
    "EyeLike": _eye_like,
    "Squeeze": _constant_input(1, "axes"), "Unsqueeze": _constant_input(1, "axes"),
    "CumSum": _constant_input(1, "axis"), "OneHot": _constant_input(1, "depth"),
    "DequantizeLinear": _dequantize, "QuantizeLinear": _zero_point(2),
    **dict.fromkeys(REDUCE, _constant_input(1, "axes")),
}
