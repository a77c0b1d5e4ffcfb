"""The options of `fuse_projections`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mmtrt.pipeline.pass_config import PassConfig


class FuseProjectionsConfig(PassConfig):
    ops: list[Literal["matmulnbits", "matmul"]] = Field(["matmulnbits", "matmul"], min_length=1, description="Which linears are fused: `matmulnbits` (ONNX Runtime's INT4 linears, as awq_int4 lowers them) and `matmul` (float MatMuls with a constant weight).")
    components: list[Literal["llm", "vision"]] = Field(["llm"], min_length=1, description="Components whose linears are fused.")
