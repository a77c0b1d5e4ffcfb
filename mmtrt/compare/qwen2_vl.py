"""`compare` for the Qwen2-VL families: inputs that follow an image's grid, and transformers' own vision forward
as the reference.

The bundle's vision graph takes the grid's integer index arithmetic as inputs (patch_pos, the window order:
mmtrt/ir/families/qwen2_vl_export.py), while transformers' `visual(pixel_values, grid_thw=...)` derives it from
the grid itself. So compare draws grids, feeds the graph the indices the runtime derives from them
(runtime/qwen2_vl.vision_indices) and transformers the grid, read back from those indices: a mistake in the
graph's re-implementation of the tower (its rotary, window mask or merge order) shows as a difference. The LLM's
`position_ids` are M-RoPE's rows of a prompt that holds an image, so its three rows differ as they do in use.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mmtrt.errors import UserError
from mmtrt.runtime.qwen2_vl import Patches, decode_positions, mrope_positions, vision_feeds, vision_indices

QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
# The most image tokens compare draws: the tower's attention grows with their square, and 64 tokens already
# cross several 2.5 windows.
VISION_TOKENS = 64
# The image in the LLM's prompt: text before it, its merge blocks (rows, columns).
TEXT_BEFORE, PROMPT_IMAGE = 2, (2, 3)


def grids(manifest: dict[str, Any]) -> list[tuple[int, int, int]]:
    """Two images (frames, patch rows, patch columns), one wide and one tall, of the most tokens up to
    VISION_TOKENS in the bundle's envelope, rows and columns unequal where the count allows."""
    merge = manifest["model"]["vision"]["merge_size"]
    most = min(manifest["dims"]["tokens"]["max"], VISION_TOKENS)
    rows = math.isqrt(most)
    if rows == most // rows and rows > 1:
        rows -= 1
    cols = most // rows
    return [(1, rows * merge, cols * merge), (1, cols * merge, rows * merge)]


def generate_vision(manifest: dict[str, Any], rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """One feed per grid: normal patch values and the index inputs the runtime derives from the grid."""
    width = manifest["components"]["vision"]["inputs"][0]["shape"][1]
    return [vision_feeds(Patches(rng.standard_normal((t * h * w, width)).astype(np.float32), (t, h, w)),
                         manifest["model"]["vision"]) for t, h, w in grids(manifest)]


def grid_of(feed: dict[str, np.ndarray], vision: dict[str, Any], where: str) -> tuple[int, int, int]:
    """The image grid whose index inputs `feed` holds; refused where they follow no grid (random indices would
    give the graph a different image than transformers gets)."""
    pos = feed["patch_pos"]
    rows, cols = (int(pos[:, i].max()) + 1 if len(pos) else 0 for i in (0, 1))
    grid = (1, rows, cols)
    merge = vision["merge_size"]
    expected = None
    if rows % merge == 0 and cols % merge == 0 and rows * cols == len(feed["pixel_values"]):
        expected = vision_indices(grid, {"spatial_merge_size": merge, "window_size": vision["window_size"],
                                         "patch_size": vision["patch_size"]})
    if expected is None or any(not np.array_equal(feed[name], value) for name, value in expected.items()):
        raise UserError(f"{where}: the vision inputs' {', '.join(n for n in feed if n != 'pixel_values')} are not "
                        "the indices of one image grid (mmtrt.runtime.qwen2_vl.vision_indices); save inputs with "
                        "--save-inputs")
    return grid


def positions(sizes: dict[str, int], shape: list[int], merge: int) -> np.ndarray:
    """`position_ids [3, batch, seq]` for the positions past..past+seq of a prompt of `past or seq` tokens (the
    prefill's; a decode step follows it) that holds an image where it fits, as the runtime computes them."""
    prompt = sizes["past"] or sizes["seq"]
    rows, cols = PROMPT_IMAGE
    image = TEXT_BEFORE + rows * cols < prompt
    ids = [0] * prompt
    if image:
        ids[TEXT_BEFORE:TEXT_BEFORE + rows * cols] = [1] * (rows * cols)
    rows_of_prompt, delta = mrope_positions(ids, 1, [(1, rows * merge, cols * merge)] if image else [], merge)
    every = np.concatenate([rows_of_prompt, decode_positions(prompt, sizes["total"] - prompt, delta)[:, 0]], axis=1)
    return np.broadcast_to(every[:, None, sizes["past"]:sizes["past"] + sizes["seq"]], shape)


class VisionReference:
    """transformers' vision tower on each feed's grid, its merged output as the graph's image_features."""

    def __init__(self, model, vision: dict[str, Any]):
        self.visual = model.model.visual.eval()
        self.vision = vision

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        grid = grid_of(feeds, self.vision, "vision")
        with torch.no_grad():
            out = self.visual(torch.from_numpy(np.ascontiguousarray(feeds["pixel_values"])),
                              grid_thw=torch.tensor([grid], dtype=torch.int64))
        return {"image_features": out.pooler_output[None].numpy()}
