"""The options of `int8_weights`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mmtrt.pipeline.pass_config import PassConfig


class Int8WeightsConfig(PassConfig):
    components: list[Literal["vision", "llm"]] = Field(["vision"], min_length=1, description="Components whose linears are stored in INT8 (`vision` includes the projector; `llm` includes lm_head).")
    include: list[str] = Field(["*"], description="Glob patterns of linear names to quantize, e.g. `vision.layers.*`; names look like `vision.layers.0.fc1`, `vision.linear.18`, `llm.layers.3.down_proj`, `llm.lm_head` (the pass report lists them).")
    exclude: list[str] = Field([], description="Glob patterns of linear names to keep in float.")
    activations: Literal["float", "dynamic", "per_token"] = Field("float", description="`float`: weight-only, the int8 weight dequantized in front of each MatMul (a quarter of the fp32 bytes; about the fp32 speed on ONNX Runtime's CPU kernels; TensorRT runs it as a weight-only GEMM). `dynamic`: `com.microsoft.DynamicQuantizeMatMul`, each linear's input quantized per tensor to uint8 at run time and multiplied in integers (ONNX Runtime's int8 GEMM, several times faster than fp32 at prefill sizes on CPUs with AVX-512 VNNI). `per_token`: the same integer product with each row (token) of the input quantized on its own scale (MatMulIntegerToFloat; about as fast, and a token's large values no longer coarsen every other token's grid). Both quantized forms are lossier than weight-only, take float32 graphs and run on ONNX Runtime only.")
