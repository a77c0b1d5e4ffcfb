"""Readings of the model facts (`ModelIR.config`, the manifest's `model`) that passes and tools share."""

from __future__ import annotations

from typing import Any


def feature_layers(vision: dict[str, Any]) -> list[int]:
    """The hidden states the projector reads, as indices from 0 (the embedding) to num_layers: LLaVA's
    vision_feature_layer is one index or a list of them, negative ones counted from the end."""
    layer = vision["feature_layer"]
    count = vision["num_layers"] + 1
    return [i % count for i in ([layer] if isinstance(layer, int) else layer)]


def deepest_feature_layer(vision: dict[str, Any]) -> int:
    """The last hidden state the projector reads: every encoder layer after it is dead."""
    return max(feature_layers(vision))
