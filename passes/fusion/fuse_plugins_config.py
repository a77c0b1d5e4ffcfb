"""The options of `fuse_plugins`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mmtrt.pipeline.pass_config import PassConfig


class FusePluginsConfig(PassConfig):
    plugins: list[Literal["token_select", "int4_gemm"]] = Field(
        ["token_select", "int4_gemm"], min_length=1,
        description="Plugins to fuse: `token_select` (token_prune's selection as one kernel: cls_attention scored in the kernel, with or without merge: contextual; any other criterion, and every dynamic budget, from the graph's scores) and `int4_gemm` (awq_int4's DequantizeLinear + MatMul, with AWQ's pre-quant Mul, as a W4A16 GEMV for batch 1 to 8).")
