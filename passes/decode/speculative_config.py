"""The options of `speculative`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mmtrt.pipeline.pass_config import PassConfig


class AdapterData(PassConfig):
    images: Literal["digits", "recipe", "none"] = Field("none", description="Calibration images whose sequences (the image features and the prompt, every position) the adapter also trains on: `digits` (scikit-learn digits, train split, with the digits prompt), `recipe` (the recipe's `calibration.images` or `calibration.jsonl`) or `none` (text only).")
    samples: int = Field(16, ge=0, description="Calibration images (the first ones of the chosen set).")
    text: Literal["reference", "recipe"] = Field("reference", description="Training text: `reference` (Python's documentation, windows from its end; the held-out score reads its start) or `recipe` (the recipe's `calibration.text` files, from their start).")
    text_windows: int = Field(16, ge=0, description="512-token windows of training text (a recipe text shorter than one window is used whole).")
    heldout_windows: int = Field(2, ge=1, description="512-token windows from the start of the reference text that the report scores the draft on; never trained on (with `text: reference` the training windows come from the text's end and must not reach them).")


class ExitAdapter(PassConfig):
    steps: int = Field(100, ge=0, description="Optimizer steps (Adam) of distillation after the closed-form start: each step matches the draft's next-token distribution to the full model's (KL divergence to its softmax) on `batch_tokens` positions; 0 keeps the least-squares fit.")
    batch_tokens: int = Field(256, ge=1, description="Positions per optimizer step, drawn from the training tokens with the seed.")
    lr: float = Field(1e-4, gt=0, description="Adam's learning rate.")
    ridge: float = Field(1e-3, ge=0, description="Regularization of the least-squares start, relative to the mean of the Gram matrix's diagonal.")
    seed: int = Field(0, description="Seed of the positions each step draws; with it, training runs on one thread, so the same recipe gives the same bytes.")
    data: AdapterData = Field(AdapterData(), description="What the adapter trains on and is scored on: `images`, `samples`, `text`, `text_windows`, `heldout_windows`.")


class SpeculativeConfig(PassConfig):
    draft: Literal["prompt_lookup", "early_exit"] = Field(description="`prompt_lookup`: the tokens that followed the latest earlier occurrence of the text's last n tokens (prompt and answer so far), no weights. `early_exit`: the LLM's own first `layers` decoder layers with its final norm and lm_head, a second LLM component that reads the full model's cache of those layers.")
    k: int = Field(4, ge=1, le=16, description="The most tokens a draft proposes per step; the runtime adapts the count per request to its acceptance rate, within 1..k.")
    max_ngram: int = Field(3, ge=1, le=8, description="`prompt_lookup` only: the longest suffix looked up (then shorter ones, down to one token).")
    layers: int | None = Field(None, ge=1, description="`early_exit` only (required there): decoder layers the draft keeps, fewer than the LLM has.")
    adapter: ExitAdapter | None = Field(None, description="`early_exit` only: an exit adapter trained at compile time, a residual linear map (hidden x hidden weights and a bias, float32) from the hidden state after `layers` layers to what the final norm and lm_head read, so that the draft predicts the full model's next token. It starts from the least-squares fit of the full model's last hidden state and is then distilled on the full model's next-token distribution; `{}` takes the defaults. Options: `steps`, `batch_tokens`, `lr`, `ridge`, `seed`, `data`.")

    @model_validator(mode="after")
    def _consistent(self) -> "SpeculativeConfig":
        if self.draft == "early_exit" and self.layers is None:
            raise ValueError("draft early_exit needs layers: the decoder layers the draft keeps, e.g. layers: 2")
        if self.draft == "prompt_lookup":
            for key in ("layers", "adapter"):
                if key in self.model_fields_set:
                    raise ValueError(f"{key} applies to draft: early_exit only; set draft: early_exit or drop {key}")
        if self.draft == "early_exit" and "max_ngram" in self.model_fields_set:
            raise ValueError("max_ngram applies to draft: prompt_lookup only; set draft: prompt_lookup or drop it")
        return self
