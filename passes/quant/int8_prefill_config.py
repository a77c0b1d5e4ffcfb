"""The options of `int8_prefill`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from mmtrt.pipeline.pass_config import PassConfig
from passes.quant.awq_int4_config import CalibrationData


class Int8PrefillConfig(PassConfig):
    min_tokens: int = Field(16, ge=2, description="Calls of at least this many new tokens per sequence (prompt chunks) run the int8 prompt graph; shorter ones (decode steps, speculative verification, a prompt's short last chunk) run the INT4 graph.")
    smoothing: float | Literal["search"] | None = Field(0.5, description="SmoothQuant's migration strength a: each linear's input channels are divided by s = max|x|^a / max|w|^(1-a), measured on the calibration data, and its weight rows multiplied by s, so activation outliers no longer coarsen every channel's int8 step. `search`: the a of 0.2 to 0.8 whose prompt graph's last hidden states on up to four calibration prompts come nearest the INT4 graph's, scored with the maxima of the other prompts (seven prompt graphs built and run at compile time; at least two prompts). `null`: no smoothing.")
    exclude: list[str] = Field(["llm.lm_head"], description="Glob patterns of linear names kept in INT4 in the prompt graph (a fused linear is kept when any of its parts matches). lm_head runs on the last position only at prefill, so int8 would not pay there.")
    float_channels: dict[str, int] = Field({}, description="Glob patterns of linear names, each with a number of input channels kept out of the int8 product: those with the largest maxima on the calibration data, multiplied in float32 beside it (LLM.int8's outlier features; a fused linear takes the largest number any of its parts matches). For inputs with a few channels far above the rest, such as the down projections', whose int8 rows they would otherwise coarsen.")
    calibration: CalibrationData = Field(CalibrationData(), description="Data the smoothing scales are measured on: `images` (`digits`, `recipe` or `none`), `samples` (images), `text` (`reference` or `recipe`), `text_windows` (512-token windows).")

    @field_validator("float_channels")
    @classmethod
    def _counts(cls, value):
        bad = {k: v for k, v in value.items() if v < 0}
        if bad:
            raise ValueError(f"float_channels takes a number of channels of 0 or more per pattern, not {bad}")
        return value

    @field_validator("smoothing", mode="before")
    @classmethod
    def _alpha_or_search(cls, value):
        if value is None or value == "search" or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                                   and 0 <= value <= 1):
            return value
        raise ValueError(f"smoothing takes a number from 0 to 1 (SmoothQuant's a), `search` or null, not {value!r}")
