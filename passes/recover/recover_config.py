"""The options of `recover`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mmtrt.pipeline.pass_config import PassConfig


class RecoverConfig(PassConfig):
    train: list[Literal["projector"]] = Field(["projector"], min_length=1, description="Parameters fitted: `projector` (the vision graph's projector weights and biases); everything else is frozen.")
    samples: int = Field(64, ge=1, description="Training images: the first ones of the digits train split, with the digits prompt.")
    heldout: int = Field(32, ge=1, description="Images after the training ones in the train split, scoring the loss before and after (never the evaluation's held-out split).")
    epochs: int = Field(3, ge=1, description="Passes over the training images.")
    batch: int = Field(4, ge=1, description="Images per optimizer step.")
    lr: float = Field(1e-4, gt=0, description="Adam's learning rate.")
    loss: Literal["kl", "mse"] = Field("kl", description="Distillation loss on the logits after the image: `kl` (KL divergence from the source's distribution) or `mse` (squared logit error).")
    positions: Literal["last", "after_image"] = Field("last", description="Logits compared: `last` (the prompt's last position, where the answer's first token is predicted) or `after_image` (every prompt position after the image; on dino-smollm after channel_prune it lowered that loss but cost digits accuracy, docs/results/recovery.md).")
    seed: int = Field(0, description="Seed of the sample order and of PyTorch's generator (same seed, same bundle).")
