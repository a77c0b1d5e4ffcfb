"""The options of `cast_precision`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mmtrt.pipeline.pass_config import PassConfig

NORMALIZATIONS = ("LayerNormalization", "RMSNormalization", "GroupNormalization", "InstanceNormalization",
                  "BatchNormalization", "LpNormalization", "MeanVarianceNormalization")


class CastPrecisionConfig(PassConfig):
    dtype: Literal["fp16", "bf16"] = Field("fp16", description="The reduced type TensorRT segments run in.")
    keep_fp32_ops: list[str] = Field(
        [*NORMALIZATIONS, "Softmax", "LogSoftmax", "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2",
         "ReduceLogSumExp", "CumSum", "Pow", "Sqrt"],
        description="Op types that stay in fp32 (they accumulate over many values or normalise).")
    keep_residual_fp32: bool = Field(True, description="Keep the residual stream in fp32: the Adds that feed, or are fed by, a normalisation's input.")
