"""Qwen2-VL and Qwen2.5-VL at run time, in numpy: the processor's preprocessing, the vision graph's index inputs,
and the LLM's M-RoPE positions.

Preprocessing is Qwen2VLImageProcessor's, pixel for pixel: `smart_resize` (sides rounded to multiples of
patch x merge, the area kept within [min_pixels, max_pixels]), torch's uint8 antialiased resize
(numpy_transform's port), rescale and normalize folded as transformers folds them, then the patches flattened in
the processor's order (merge blocks row-major, each `[C, T, P, P]` with the frame repeated T times).

The vision graph gets integer indices derived from the grid (see mmtrt/ir/families/qwen2_vl_export.py); the LLM
gets `position_ids [3, batch, seq]`: text positions count up on all three rows, an image's tokens take
(start, start + row, start + column) and the text after it resumes at start + max(rows, columns). Each sequence
keeps the difference between its next position and its length (its rope delta), so decode steps need only the
cache length: position = length + delta on all three rows, as transformers' `generate` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from mmtrt.preprocess.numpy_transform import convert_rgb, resize_pixels
from mmtrt.errors import UserError


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' Qwen2-VL smart_resize, the same float arithmetic; refuses an aspect ratio above 200."""
    if max(height, width) / min(height, width) > 200:
        raise UserError(f"image is {width}x{height}, an aspect ratio above 200, which Qwen2-VL's preprocessing "
                        "refuses; crop it closer to square")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass
class Patches:
    """One preprocessed image: flattened patches and its grid (frames, patch rows, patch columns)."""

    values: np.ndarray
    grid: tuple[int, int, int]

    def tobytes(self) -> bytes:
        """The patches and the grid: two images with equal patches but another grid must not share a key."""
        return np.asarray(self.grid, np.int64).tobytes() + np.ascontiguousarray(self.values).tobytes()


def preprocess(image: Image.Image, spec: dict[str, Any]) -> Patches:
    """Qwen2VLImageProcessor's pixel_values and image_grid_thw for one image."""
    ops = {op["op"]: op for op in spec["ops"]}
    resize, patch = ops["smart_resize"], ops["patchify"]
    if "convert_rgb" in ops:
        image = convert_rgb(image)
    pixels = np.asarray(image, dtype=np.uint8)
    pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
    height, width = smart_resize(pixels.shape[0], pixels.shape[1], resize["factor"], resize["min_pixels"],
                                 resize["max_pixels"])
    pixels = resize_pixels(pixels, height, width, resize["interpolation"])
    out = pixels.transpose(2, 0, 1).astype(np.float32)
    inverse = np.float32(1.0 / ops.get("rescale", {"factor": 1.0})["factor"])
    if "normalize" in ops:
        mean = np.asarray(ops["normalize"]["mean"], np.float32) * inverse
        std = np.asarray(ops["normalize"]["std"], np.float32) * inverse
        out = (out - mean[:, None, None]) / std[:, None, None]
    elif "rescale" in ops:
        out = out * np.float32(ops["rescale"]["factor"])
    return patchify(out, patch["patch_size"], patch["merge_size"], patch["temporal_patch_size"])


def patchify(image: np.ndarray, patch: int, merge: int, temporal: int) -> Patches:
    """[C, H, W] -> [rows * cols, C * T * P * P] in the processor's order (a pure permutation and repeat)."""
    channels, height, width = image.shape
    rows, cols = height // patch, width // patch
    blocks = image.reshape(channels, rows // merge, merge, patch, cols // merge, merge, patch)
    blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)  # [rows/m, cols/m, m, m, C, P, P]
    frames = np.repeat(blocks[:, :, :, :, :, None], temporal, axis=5)
    return Patches(np.ascontiguousarray(frames.reshape(rows * cols, channels * temporal * patch * patch)),
                   (1, rows, cols))


def vision_feeds(patches: Patches, vision: dict[str, Any]) -> dict[str, np.ndarray]:
    """The vision graph's feeds for one image: its patches and their index inputs (`vision`: the model's vision
    facts, merge_size, window_size, patch_size)."""
    indices = vision_indices(patches.grid, {"spatial_merge_size": vision["merge_size"],
                                            "window_size": vision["window_size"], "patch_size": vision["patch_size"]})
    return {"pixel_values": patches.values, **indices}


def vision_indices(grid: tuple[int, int, int], vision: dict[str, Any]) -> dict[str, np.ndarray]:
    """The vision graph's index inputs for one image: patch_pos, and the window order under window attention."""
    _, rows, cols = grid
    merge = vision["spatial_merge_size"]
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    shape = (rows // merge, merge, cols // merge, merge)
    pos = np.stack([r.reshape(shape).transpose(0, 2, 1, 3).ravel(), c.reshape(shape).transpose(0, 2, 1, 3).ravel()],
                   axis=-1)
    out = {"patch_pos": pos.astype(np.int64)}
    if vision.get("window_size"):
        out.update(window_order(rows // merge, cols // merge, vision["window_size"] // merge // vision["patch_size"],
                                merge * merge))
    return out


def window_order(rows: int, cols: int, side: int, unit: int) -> dict[str, np.ndarray]:
    """transformers' get_vision_window_index for one frame: merge blocks taken window by window (windows of
    side x side blocks, row-major, the last ones cut by the grid), the inverse order, and each reordered patch's
    window."""
    block = np.arange(rows * cols).reshape(rows, cols)
    wr, wc = -(-rows // side), -(-cols // side)
    order, window = [], []
    for i in range(wr):
        for j in range(wc):
            members = block[i * side:(i + 1) * side, j * side:(j + 1) * side].ravel()
            order.append(members)
            window.append(np.full(members.size * unit, len(window), np.int64))
    index = np.concatenate(order).astype(np.int64)
    return {"window_index": index, "window_reverse": np.argsort(index).astype(np.int64),
            "window_id": np.concatenate(window)}


def token_count(grid: tuple[int, int, int], merge: int) -> int:
    return grid[0] * grid[1] * grid[2] // (merge * merge)


def mrope_positions(ids: list[int], image_token_id: int, grids: list[tuple[int, int, int]],
                    merge: int) -> tuple[np.ndarray, int]:
    """transformers' get_rope_index for one sequence: positions [3, len(ids)] and the rope delta (next position
    minus length). Each run of image tokens takes the next grid."""
    rows, start, i, images = [], 0, 0, iter(grids)
    while i < len(ids):
        j = i
        if ids[i] != image_token_id:
            while j < len(ids) and ids[j] != image_token_id:
                j += 1
            rows.append(np.broadcast_to(np.arange(start, start + j - i), (3, j - i)))
            start += j - i
        else:
            t, h, w = next(images)
            h, w = h // merge, w // merge
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
            rows.append(np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + start)
            j = i + t * h * w
            start += max(h, w)
        i = j
    positions = np.concatenate(rows, axis=1).astype(np.int64)
    return positions, int(positions.max()) + 1 - len(ids)


def decode_positions(length: int, seq: int, delta: int) -> np.ndarray:
    """[3, 1, seq]: positions after a cache of `length` tokens, all three rows alike."""
    return np.broadcast_to(np.arange(length, length + seq, dtype=np.int64) + delta, (3, 1, seq)).copy()


class QwenImages:
    """What a loaded Qwen2-VL bundle does with images and positions (the Pipeline's family hook)."""

    def __init__(self, manifest: dict[str, Any], spec: dict[str, Any]):
        self.spec, self.vision = spec, manifest["model"]["vision"]
        self.image_token_id = manifest["model"]["image_token_id"]
        self.most = manifest["dims"]["tokens"]["max"]

    def pixels(self, image: Image.Image) -> Patches:
        patches = preprocess(image, self.spec)
        count = token_count(patches.grid, self.vision["merge_size"])
        if count > self.most:
            raise UserError(f"image is {image.width}x{image.height}; resized for Qwen2-VL it takes {count} image "
                            f"tokens, more than the bundle's {self.most} (the processor's max_pixels; an elongated "
                            "image keeps at least one 28-pixel block per side); crop it closer to square")
        return patches

    def vision_feeds(self, patches: Patches) -> dict[str, np.ndarray]:
        return vision_feeds(patches, self.vision)

    def positions(self, ids: list[int], images: list[Patches]) -> tuple[np.ndarray, int]:
        """The prompt's position_ids [3, 1, seq] and its rope delta, for its images in order."""
        grids = [p.grid for p in images]
        positions, delta = mrope_positions(ids, self.image_token_id, grids, self.vision["merge_size"])
        return positions[:, None, :], delta


def family_images(manifest: dict[str, Any], spec: dict[str, Any]) -> QwenImages | None:
    """The family hook of a bundle whose images are not one fixed-size tensor (None: LLaVA's path)."""
    return QwenImages(manifest, spec) if spec.get("family") == "qwen2_vl" else None
