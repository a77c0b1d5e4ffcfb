"""The options of `fold_prequant_scale`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mmtrt.pipeline.pass_config import PassConfig


class FoldPrequantScaleConfig(PassConfig):
    components: list[Literal["llm", "vision"]] = Field(["llm"], min_length=1, description="Components whose constant per-channel Muls are folded into their producers.")
