"""The plugins mmtrt ships: how an ONNX node names one (TensorRT's ONNX parser looks a node up by op_type = the
plugin name with the string attributes plugin_namespace and plugin_version, and `aot` selects the AOT
implementation), the kernel behind it and its attributes, in the order the registration declares them."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

NAMESPACE = "mmtrt"
DOMAIN = "mmtrt"  # the node's domain names the local function that decomposes it (ONNX Runtime runs that)
CONTROL_ATTRIBUTES = ("plugin_namespace", "plugin_version", "aot")


@dataclass(frozen=True)
class PluginSpec:
    key: str  # the recipe's name that fuses it: `fuse_plugins: {plugins: [token_select]}`
    name: str  # op_type and TensorRT plugin name
    version: str
    kernel: str  # extern "C" entry prefix in kernels.cu; the suffix is the activation type
    attributes: tuple[str, ...]
    why: str

    @property
    def plugin_id(self) -> str:
        return f"{NAMESPACE}::{self.name}"


PLUGINS = {
    "token_select": PluginSpec(
        "token_select", "TokenSelect", "1", "mmtrt_token_select", ("keep", "cls", "scale"),
        "token_prune's selection as one kernel: TensorRT runs the decomposition as about 12 small kernels and a "
        "data-dependent GatherND"),
    "token_select_merge": PluginSpec(
        "token_select", "TokenSelectMerge", "1", "mmtrt_token_select_merge", ("keep", "cls", "scale", "contextual"),
        "token_prune's selection with VisionZip's contextual merge as one kernel: the decomposition adds about 30 "
        "more small kernels (gathers, similarity, assignment, sums)"),
    "token_select_scored": PluginSpec(
        "token_select", "TokenSelectScored", "1", "mmtrt_token_select_scored", ("keep",),
        "token_prune's fixed selection from a score the graph computes (norm, random, attention_entropy, saliency): "
        "top-k, the kept indices in spatial order and the gather in one kernel instead of two TopKs and a "
        "data-dependent GatherND"),
    "token_select_dynamic": PluginSpec(
        "token_select", "TokenSelectDynamic", "1", "mmtrt_token_select_dynamic", ("most", "least", "mass"),
        "token_prune's dynamic budget from a score the graph computes (any criterion): the count that reaches the "
        "score mass, the padded block and the count in one kernel instead of about 20 small ones"),
    "int4_gemm": PluginSpec(
        "int4_gemm", "Int4GroupGemm", "1", "mmtrt_int4_gemm", ("group_size",),
        "W4A16 GEMV for decode (1 to 8 rows): reads the INT4 weight once instead of materialising the dequantized "
        "fp16 weight (4x the bytes) before a generic GEMM"),
}
BY_NAME = {p.name: p for p in PLUGINS.values()}
KERNEL_SUFFIX = {onnx.TensorProto.FLOAT: "f32", onnx.TensorProto.FLOAT16: "f16", onnx.TensorProto.BFLOAT16: "bf16"}


def plugin_of(node: onnx.NodeProto) -> PluginSpec | None:
    """The plugin a node calls, or None: domain mmtrt, a known op_type and plugin_namespace mmtrt."""
    if node.domain != DOMAIN or node.op_type not in BY_NAME:
        return None
    namespace = next((a.s.decode() for a in node.attribute if a.name == "plugin_namespace"), None)
    return BY_NAME[node.op_type] if namespace == NAMESPACE else None
