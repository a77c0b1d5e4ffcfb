"""Runs a preprocessing spec (see mmtrt.ir.preprocess) in numpy, pixel for pixel what the TorchVision backend gives.

The runtime must not import torch (half a GiB of RSS), so this repeats the arithmetic of ATen's uint8 antialiased
resize (int16 weights with the kernel's own precision, horizontal pass first, an unchanged axis skipped), as the
C++ runtime's resize.cpp does, then the int-anchored crop and the normalize with the rescale folded into mean and
std in float32. A spec this module does not cover (another interpolation, resize without antialias) is run by the
TorchVision backend, imported only then.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from PIL import Image

SPEC_VERSION = 1
OP_ORDER = ("convert_rgb", "resize", "center_crop", "rescale", "normalize")
FILTERS = {"bilinear": 2, "bicubic": 4}


def convert_rgb(image: Image.Image) -> Image.Image:
    """Composite transparency onto white as transformers' convert_to_rgb does; a plain convert just drops alpha."""
    if "A" not in image.getbands() and image.info.get("transparency") is None:
        return image.convert("RGB")
    image = image.convert("RGBA")
    background = Image.new("RGBA", image.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, image).convert("RGB")


def ops_by_name(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pipeline has one fixed order; refuse a spec written for another version or order."""
    if spec.get("version") != SPEC_VERSION:
        raise ValueError(f"preprocessing spec version {spec.get('version')!r}, expected {SPEC_VERSION}")
    names = [op["op"] for op in spec["ops"]]
    if any(n not in OP_ORDER for n in names) or names != sorted(set(names), key=OP_ORDER.index):
        raise ValueError(f"preprocessing ops {names} are not a subsequence of {list(OP_ORDER)}")
    return {op["op"]: op for op in spec["ops"]}


def covers(spec: dict[str, Any]) -> bool:
    if spec.get("family") == "qwen2_vl":  # mmtrt.runtime.qwen2_vl runs it in numpy
        return True
    resize = ops_by_name(spec).get("resize")
    return resize is None or (resize["interpolation"] == "nearest-exact" or
                              (resize["interpolation"] in FILTERS and resize["antialias"]))


def build_transform(spec: dict[str, Any]) -> Callable[[Image.Image], np.ndarray]:
    """PIL image in, float32 [3, H, W] out; the TorchVision backend's where numpy does not cover the spec."""
    if not covers(spec):
        from mmtrt.preprocess.torchvision_transform import build_transform as torchvision_transform

        transform = torchvision_transform(spec)
        return lambda image: transform(image).numpy()
    ops = ops_by_name(spec)
    return lambda image: _run(ops, image)


def _run(ops: dict[str, dict[str, Any]], image: Image.Image) -> np.ndarray:
    return transform_pixels(ops, image_pixels(ops, image))


def image_pixels(ops: dict[str, dict[str, Any]], image: Image.Image) -> np.ndarray:
    """The image as uint8 [H, W, C], converted to RGB where the spec says so."""
    if "convert_rgb" in ops:
        image = convert_rgb(image)
    pixels = np.asarray(image, dtype=np.uint8)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


def transform_pixels(ops: dict[str, dict[str, Any]], pixels: np.ndarray) -> np.ndarray:
    """uint8 [H, W, C] through the spec's resize, crop and normalize: float32 [C, H, W]."""
    if "resize" in ops:
        pixels = _resize(pixels, ops["resize"])
    if "center_crop" in ops:
        pixels = _center_crop(pixels, *ops["center_crop"]["size"])
    out = pixels.transpose(2, 0, 1).astype(np.float32)
    if "normalize" in ops:
        inverse = np.float32(1.0 / ops.get("rescale", {"factor": 1.0})["factor"])
        mean = np.asarray(ops["normalize"]["mean"], np.float32) * inverse
        std = np.asarray(ops["normalize"]["std"], np.float32) * inverse
        return np.ascontiguousarray((out - mean[:, None, None]) / std[:, None, None])
    if "rescale" in ops:
        return out * np.float32(ops["rescale"]["factor"])
    return out


def resized_size(height: int, width: int, size: list[int]) -> tuple[int, int]:
    """torchvision's _compute_resized_output_size: one size is the shorter edge, the longer one truncated."""
    if len(size) == 2:
        return size[0], size[1]
    short, long = min(height, width), max(height, width)
    new_long = int(size[0] * long / short)
    return (new_long, size[0]) if width <= height else (size[0], new_long)


def _resize(pixels: np.ndarray, op: dict[str, Any]) -> np.ndarray:
    return resize_pixels(pixels, *resized_size(*pixels.shape[:2], op["size"]), op["interpolation"])


def resize_pixels(pixels: np.ndarray, out_h: int, out_w: int, interpolation: str) -> np.ndarray:
    """uint8 [H, W, C] to [out_h, out_w, C] as torchvision resizes uint8 with antialias."""
    height, width = pixels.shape[:2]
    if interpolation == "nearest-exact":
        rows = np.minimum(np.floor((np.arange(out_h, dtype=np.float32) + 0.5) * np.float32(height / out_h)), height - 1)
        cols = np.minimum(np.floor((np.arange(out_w, dtype=np.float32) + 0.5) * np.float32(width / out_w)), width - 1)
        return pixels[rows.astype(np.int64)][:, cols.astype(np.int64)]
    taps = FILTERS[interpolation]
    if out_w != width:
        pixels = _resize_axis(pixels, 1, out_w, taps)
    if out_h != height:
        pixels = _resize_axis(pixels, 0, out_h, taps)
    return pixels


def _filter(x: np.ndarray, taps: int) -> np.ndarray:
    x = np.abs(x)
    if taps == 2:
        return np.where(x < 1.0, 1.0 - x, 0.0)
    a = -0.5
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _axis_weights(size_in: int, size_out: int, taps: int) -> tuple[np.ndarray, np.ndarray, int]:
    """ATen's _compute_index_ranges_int16_weights: per output, the first input index and int16 weights."""
    scale = size_in / size_out
    support = taps * 0.5 * scale if scale >= 1.0 else taps * 0.5
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    stride = int(np.ceil(support)) * 2 + 1
    center = scale * (np.arange(size_out) + 0.5)
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C casts truncate toward zero
    xsize = np.clip(np.minimum((center + support + 0.5).astype(np.int64), size_in) - xmin, 0, stride)
    j = np.arange(stride)
    inside = j[None, :] < xsize[:, None]
    weights = np.where(inside, _filter((j[None, :] + xmin[:, None] - center[:, None] + 0.5) * invscale, taps), 0.0)
    total = weights.sum(axis=1, keepdims=True)
    weights = np.where(total != 0.0, weights / np.where(total != 0.0, total, 1.0), weights)
    wt_max = weights.max() if weights.size else 0.0
    precision = 0
    while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    ints = np.where(scaled < 0, (scaled - 0.5).astype(np.int64), (scaled + 0.5).astype(np.int64))
    return xmin, ints.astype(np.int16).astype(np.int64), precision


def _resize_axis(pixels: np.ndarray, axis: int, size_out: int, taps: int) -> np.ndarray:
    """One pass of the separable kernel along `axis` (0 rows, 1 columns); sums in integers, as the kernel does."""
    size_in = pixels.shape[axis]
    xmin, weights, precision = _axis_weights(size_in, size_out, taps)
    acc = np.full(pixels.shape[:axis] + (size_out,) + pixels.shape[axis + 1:], (1 << precision) >> 1, np.int64)
    src = pixels.astype(np.int64)
    for j in range(weights.shape[1]):
        index = np.minimum(xmin + j, size_in - 1)  # out-of-range taps have weight 0
        w = weights[:, j].reshape((-1, 1, 1) if axis == 0 else (1, -1, 1))
        acc += np.take(src, index, axis=axis) * w
    return np.clip(acc >> precision, 0, 255).astype(np.uint8)


def _center_crop(pixels: np.ndarray, crop_h: int, crop_w: int) -> np.ndarray:
    """Anchored at int((side - crop) / 2) like the HF processors; outside the image, zeros (the odd pixel of the
    padding bottom/right, like HF's torchvision backend)."""
    height, width, channels = pixels.shape
    top, left = int((height - crop_h) / 2), int((width - crop_w) / 2)
    out = np.zeros((crop_h, crop_w, channels), np.uint8)
    ys, xs = max(top, 0), max(left, 0)
    ye, xe = min(top + crop_h, height), min(left + crop_w, width)
    out[ys - top:ye - top, xs - left:xe - left] = pixels[ys:ye, xs:xe]
    return out
