"""The options of `int8_weights`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mmtrt.pipeline.pass_config import PassConfig


class Int8WeightsConfig(PassConfig):
    components: list[Literal["vision"]] = Field(["vision"], min_length=1, description="Components whose linears are stored in INT8 (`vision` includes the projector).")
    include: list[str] = Field(["*"], description="Glob patterns of linear names to quantize, e.g. `vision.layers.*`; names look like `vision.layers.0.fc1`, `vision.linear.18` (the pass report lists them).")
    exclude: list[str] = Field([], description="Glob patterns of linear names to keep in float.")
