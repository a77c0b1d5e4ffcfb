"""The options of `channel_prune`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mmtrt.pipeline.pass_config import PassConfig


class Ratios(PassConfig):
    mlp: float = Field(0.0, ge=0, lt=1, description="Share of every layer's MLP hidden channels to remove.")
    heads: float = Field(0.0, ge=0, lt=1, description="Share of every layer's attention heads to remove (KV groups with grouped-query attention; at least one stays).")


class Calibration(PassConfig):
    images: Literal["digits", "recipe"] = Field("digits", description="Calibration images: `digits` (scikit-learn digits, train split, with the digits prompt) or `recipe` (the recipe's `calibration.images` folder and `calibration.jsonl`, each with its prompt).")
    samples: int = Field(16, ge=0, description="Calibration images (the first ones of the chosen set).")
    text: Literal["reference", "recipe"] = Field("reference", description="Calibration text for the LLM: `reference` (taken from the end of Python's documentation, which the perplexity suite never reads) or `recipe` (the recipe's `calibration.text` files).")
    text_windows: int = Field(4, ge=0, description="512-token windows of calibration text (a recipe text shorter than one window is used whole).")


class ChannelPruneConfig(PassConfig):
    vision: Ratios = Field(Ratios(), description="Ratios for the vision encoder: `mlp`, `heads`.")
    llm: Ratios = Field(Ratios(), description="Ratios for the LLM: `mlp`, `heads`.")
    importance: Literal["activation", "l2"] = Field("activation", description="`activation` (default; on dino-smollm it keeps 84 % digits accuracy where `l2` keeps 6 %, at 30 % of the vision MLP): mean magnitude of the unit's activations on calibration data (Minitron); `l2`: weight magnitude over the whole dependency group, each member normalised by its mean (DepGraph).")
    bias_compensation: bool = Field(True, description="Add the removed units' mean contribution on calibration data to the consuming linear's bias (FLAP), so the next layer sees the expected value instead of zero.")
    multiple: int = Field(8, ge=1, description="Kept MLP channels round to a multiple of this (kernels stay efficient); heads are whole.")
    calibration: Calibration = Field(Calibration(), description="For `activation` importance and `bias_compensation`: `images` (`digits` or `recipe`), `samples`, `text` (`reference` or `recipe`) and `text_windows`.")

    @property
    def calibrates(self) -> bool:
        return self.importance == "activation" or self.bias_compensation

    @model_validator(mode="after")
    def _consistent(self) -> "ChannelPruneConfig":
        cal = self.calibration
        fix = "give calibration data or set importance: l2 and bias_compensation: false"
        if self.calibrates and self.vision != Ratios() and not cal.samples:
            raise ValueError(f"pruning the vision encoder with calibration needs calibration.samples images; {fix}")
        if self.calibrates and self.llm != Ratios() and not (cal.samples or cal.text_windows):
            raise ValueError(f"pruning the LLM with calibration needs calibration.samples or text_windows; {fix}")
        return self
