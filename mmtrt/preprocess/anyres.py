"""Any-resolution images (LLaVA-NeXT, LLaVA-OneVision) in numpy, as transformers tiles them and packs their features.

An image is resized into the best of the model's grid resolutions (`pinpoints`), keeping its aspect, padded to it
with zeros and cut into tiles; the whole image resized to one tile (the base) goes first. The vision encoder sees
every tile. The tiles' features are laid back out as the grid they came from, the padding's rows or columns cut
away (unpadded), pooled bilinearly where the grid is far above `max_patches` tiles' worth (OneVision's
`anyres_max_N`), and every row ended by the learned `image_newline`; the base's features go first. The token
count follows from the image's size alone, so it is known before the vision encoder runs and bounded per envelope.

Two dictionaries drive it: the preprocessing spec's `tiling` ({"pinpoints", "tile": [h, w], "base": [h, w],
"interpolation"}) and the model facts' `vision.anyres` ({"pinpoints", "tile", "grid", "max_patches", "layout",
"max_tiles"}); `layout` is "grid" (as above) or "tiles" (token_prune ran per tile: each tile's kept tokens in tile
order, base first, no newline).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np
from PIL import Image

from mmtrt.preprocess.numpy_transform import image_pixels, ops_by_name, resize_pixels, transform_pixels

NEWLINE_ASSET = "vision/image_newline.npy"


def best_resolution(height: int, width: int, pinpoints: list[list[int]]) -> tuple[int, int]:
    """transformers' select_best_resolution: the most of the image kept, then the least padding."""
    best, most_kept, least_waste = None, 0, math.inf
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        waste = w * h - kept
        if kept > most_kept or (kept == most_kept and waste < least_waste):
            best, most_kept, least_waste = (h, w), kept, waste
    return best


def fitted_size(height: int, width: int, target: tuple[int, int]) -> tuple[int, int]:
    """transformers' get_patch_output_size: the image resized into `target`, aspect kept."""
    target_h, target_w = target
    scale_w, scale_h = target_w / width, target_h / height
    if scale_w < scale_h:
        return min(math.ceil(height * scale_w), target_h), target_w
    return target_h, min(math.ceil(width * scale_h), target_w)


def grid_tiles(height: int, width: int, pinpoints: list[list[int]], tile: int) -> tuple[int, int]:
    """Rows and columns of tiles an image of this size is cut into."""
    h, w = best_resolution(height, width, pinpoints)
    return h // tile, w // tile


def build_tiler(spec: dict[str, Any]) -> Callable[[Image.Image], np.ndarray]:
    """PIL image in, the vision input [1 + tiles, 3, h, w] out, pixel for pixel the processor's."""
    ops, tiling = ops_by_name(spec), spec["tiling"]
    resize = functools.partial(_resize, interpolation=tiling["interpolation"])
    finish = functools.partial(transform_pixels, ops)
    return lambda image: tile_pixels(image_pixels(ops, image), tiling, resize, finish)


def _resize(pixels: np.ndarray, height: int, width: int, interpolation: str) -> np.ndarray:
    return resize_pixels(pixels, height, width, interpolation)


def tile_pixels(pixels: np.ndarray, tiling: dict[str, Any], resize: Callable, finish: Callable) -> np.ndarray:
    """uint8 [H, W, C] to the vision input [1 + tiles, C, h, w]: the base, then the tiles row by row. `resize`
    is (pixels, height, width) -> pixels; `finish` takes a tile's uint8 pixels to floats (the spec's ops)."""
    height, width = pixels.shape[:2]
    target = best_resolution(height, width, tiling["pinpoints"])
    fit_h, fit_w = fitted_size(height, width, target)
    resized = resize(pixels, fit_h, fit_w)
    top, left = (target[0] - fit_h) // 2, (target[1] - fit_w) // 2
    canvas = np.zeros((*target, pixels.shape[2]), np.uint8)
    canvas[top:top + fit_h, left:left + fit_w] = resized
    tile_h, tile_w = tiling["tile"]
    tiles = [canvas[i:i + tile_h, j:j + tile_w]
             for i in range(0, target[0], tile_h) for j in range(0, target[1], tile_w)]
    base = resize(pixels, *tiling["base"])
    return np.stack([finish(t) for t in [base, *tiles]])


def unpadded(height: int, width: int, rows: int, cols: int) -> tuple[int, int, int, int]:
    """transformers' unpad_image on a [rows, cols] grid of features: (top, bottom, left, right) of the image's part."""
    if width / height > cols / rows:
        pad = (rows - int(round(height * (cols / width), 7))) // 2
        return pad, rows - pad, 0, cols
    pad = (cols - int(round(width * (rows / height), 7))) // 2
    return 0, rows, pad, cols - pad


def pooled(rows: int, cols: int, grid: int, max_patches: int | None) -> tuple[int, int]:
    """OneVision's anyres_max: a grid above 1.1 x sqrt(max_patches) tiles' worth is shrunk to about that."""
    if max_patches is None:
        return rows, cols
    ratio = math.sqrt(rows * cols / (max_patches * grid ** 2))
    return (int(rows // ratio), int(cols // ratio)) if ratio > 1.1 else (rows, cols)


def feature_rows(height: int, width: int, anyres: dict[str, Any]) -> tuple[tuple[int, int, int, int], tuple[int, int]]:
    """The unpadded window of the image's feature grid and the rows and columns it is packed as."""
    tile_rows, tile_cols = grid_tiles(height, width, anyres["pinpoints"], anyres["tile"])
    window = unpadded(height, width, tile_rows * anyres["grid"], tile_cols * anyres["grid"])
    top, bottom, left, right = window
    return window, pooled(bottom - top, right - left, anyres["grid"], anyres["max_patches"])


def image_tokens(height: int, width: int, anyres: dict[str, Any], tile_tokens: int) -> int:
    """The tokens an image of this size takes in the prompt."""
    if anyres["layout"] == "tiles":
        rows, cols = grid_tiles(height, width, anyres["pinpoints"], anyres["tile"])
        return (1 + rows * cols) * tile_tokens
    _, (rows, cols) = feature_rows(height, width, anyres)
    return tile_tokens + rows * (cols + 1)


def token_bound(anyres: dict[str, Any], tile_tokens: int) -> int:
    """The most tokens an image takes whose grid has at most `max_tiles` tiles: per pinpoint, every window
    unpadding may leave (the full grid is the largest where nothing is pooled)."""
    if anyres["layout"] == "tiles":
        return (1 + anyres["max_tiles"]) * tile_tokens
    grid, most = anyres["grid"], 0
    for h, w in anyres["pinpoints"]:
        rows, cols = h // anyres["tile"] * grid, w // anyres["tile"] * grid
        if rows * cols > anyres["max_tiles"] * grid ** 2:
            continue
        windows = [(r, cols) for r in range(1, rows + 1)] + [(rows, c) for c in range(1, cols + 1)]
        for r, c in windows:
            pr, pc = pooled(r, c, grid, anyres["max_patches"])
            most = max(most, tile_tokens + pr * (pc + 1))
    return most


def pack(features: np.ndarray, counts: np.ndarray | None, height: int, width: int, anyres: dict[str, Any],
         newline: np.ndarray) -> np.ndarray:
    """The vision output of one image's tiles [1 + tiles, T, D] (`counts` per tile under a dynamic token budget)
    as the image's tokens [N, D] in prompt order."""
    if anyres["layout"] == "tiles":
        return np.concatenate([f[:c] for f, c in zip(features, counts)] if counts is not None else list(features))
    grid, dim = anyres["grid"], features.shape[-1]
    tile_rows, tile_cols = grid_tiles(height, width, anyres["pinpoints"], anyres["tile"])
    layout = features[1:].reshape(tile_rows, tile_cols, grid, grid, dim).transpose(0, 2, 1, 3, 4)
    layout = layout.reshape(tile_rows * grid, tile_cols * grid, dim)
    (top, bottom, left, right), (rows, cols) = feature_rows(height, width, anyres)
    layout = layout[top:bottom, left:right]
    if (rows, cols) != layout.shape[:2]:
        layout = bilinear(layout, rows, cols)
    ended = np.concatenate([layout, np.broadcast_to(newline.astype(features.dtype), (rows, 1, dim))], axis=1)
    return np.concatenate([features[0], ended.reshape(rows * (cols + 1), dim)])


def bilinear(x: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """[H, W, D] resized as torch's interpolate(mode="bilinear", align_corners=False) does, in float32."""
    (i0, i1, h0, h1), (j0, j1, w0, w1) = _linear_taps(x.shape[0], out_h), _linear_taps(x.shape[1], out_w)
    w0, w1 = w0[None, :, None], w1[None, :, None]
    upper = x[i0][:, j0] * w0 + x[i0][:, j1] * w1
    lower = x[i1][:, j0] * w0 + x[i1][:, j1] * w1
    return upper * h0[:, None, None] + lower * h1[:, None, None]


def _linear_taps(size_in: int, size_out: int):
    """ATen's compute_source_index_and_lambda in float32: per output, two input indices and their weights. The
    source index is scale * (i + 0.5) - 0.5 rounded once, as the kernel's fused multiply-add gives it (exact in
    float64: a float32 times a short half-integer)."""
    if size_in == size_out:
        index = np.arange(size_out)
        return index, index, np.ones(size_out, np.float32), np.zeros(size_out, np.float32)
    scale = np.float64(np.float32(size_in) / np.float32(size_out))
    source = np.maximum(scale * (np.arange(size_out) + 0.5) - 0.5, 0).astype(np.float32)
    first = np.minimum(np.floor(source).astype(np.int64), size_in - 1)
    second = first + (first < size_in - 1)
    far = np.clip(source - first.astype(np.float32), 0, 1).astype(np.float32)
    return first, second, np.float32(1) - far, far
