"""Readings of the model facts (`ModelIR.config`, the manifest's `model`) that passes and tools share."""

from __future__ import annotations

from typing import Any

from mmtrt.preprocess.anyres import token_bound


def feature_layers(vision: dict[str, Any]) -> list[int]:
    """The hidden states the projector reads, as indices from 0 (the embedding) to num_layers: LLaVA's
    vision_feature_layer is one index or a list of them, negative ones counted from the end."""
    layer = vision["feature_layer"]
    count = vision["num_layers"] + 1
    return [i % count for i in ([layer] if isinstance(layer, int) else layer)]


def deepest_feature_layer(vision: dict[str, Any]) -> int:
    """The last hidden state the projector reads: every encoder layer after it is dead."""
    return max(feature_layers(vision))


def item_tokens(vision: dict[str, Any]) -> int:
    """Tokens the vision component yields per input it encodes: per image, or per tile of an any-resolution one."""
    return vision.get("tile_tokens", vision["image_tokens"])


def with_item_tokens(vision: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The vision facts once each encoded input yields `tokens` (a pass chose them): an any-resolution image then
    takes its tiles' tokens one tile after another, without the grid layout, and its bound follows."""
    if "anyres" not in vision:
        return {**vision, "image_tokens": tokens}
    anyres = {**vision["anyres"], "layout": "tiles"}
    return {**vision, "tile_tokens": tokens, "anyres": anyres, "image_tokens": token_bound(anyres, tokens)}
