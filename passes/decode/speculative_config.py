"""The options of `speculative`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mmtrt.pipeline.pass_config import PassConfig


class SpeculativeConfig(PassConfig):
    draft: Literal["prompt_lookup", "early_exit"] = Field(description="`prompt_lookup`: the tokens that followed the latest earlier occurrence of the text's last n tokens (prompt and answer so far), no weights. `early_exit`: the LLM's own first `layers` decoder layers with its final norm and lm_head, a second LLM component with its own KV cache.")
    k: int = Field(4, ge=1, le=16, description="The most tokens a draft proposes per step; the runtime adapts the count per request to its acceptance rate, within 1..k.")
    max_ngram: int = Field(3, ge=1, le=8, description="`prompt_lookup` only: the longest suffix looked up (then shorter ones, down to one token).")
    layers: int | None = Field(None, ge=1, description="`early_exit` only (required there): decoder layers the draft keeps, fewer than the LLM has.")

    @model_validator(mode="after")
    def _consistent(self) -> "SpeculativeConfig":
        if self.draft == "early_exit" and self.layers is None:
            raise ValueError("draft early_exit needs layers: the decoder layers the draft keeps, e.g. layers: 2")
        if self.draft == "prompt_lookup" and "layers" in self.model_fields_set:
            raise ValueError("layers applies to draft: early_exit only; set draft: early_exit or drop layers")
        if self.draft == "early_exit" and "max_ngram" in self.model_fields_set:
            raise ValueError("max_ngram applies to draft: prompt_lookup only; set draft: prompt_lookup or drop it")
        return self
