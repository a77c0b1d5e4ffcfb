"""Reads a Hugging Face image processor into a JSON-able preprocessing spec ("TorchVision graph").

The spec is what the bundle stores and what mmtrt.preprocess.torchvision_transform runs:

    {"version": 1,
     "ops": [{"op": "convert_rgb"},
             {"op": "resize", "size": [224], "interpolation": "bicubic", "antialias": true},
             {"op": "center_crop", "size": [224, 224]},
             {"op": "rescale", "factor": 0.00392156862745098},
             {"op": "normalize", "mean": [0.48145466, ...], "std": [0.26862954, ...]}],
     "output_size": [224, 224]}

An any-resolution processor (LLaVA-NeXT, LLaVA-OneVision) adds `"tiling": {"pinpoints": [[h, w], ...],
"tile": [h, w], "base": [h, w], "interpolation": ...}`: the image is cut into tiles first
(mmtrt.preprocess.anyres), and the ops run on each tile and the base image.

Ops appear in that order, each only when the processor applies it. resize "size" follows torchvision:
[s] scales the shorter edge to s (the longer one truncated to int, as HF does), [h, w] is the exact size. Values are
plain Python ints/floats/lists copied from the processor, so the spec survives json round trips bit-exactly.
"""

from __future__ import annotations

from typing import Any

from PIL.Image import Resampling
from transformers import (
    BitImageProcessor,
    BitImageProcessorPil,
    CLIPImageProcessor,
    CLIPImageProcessorPil,
    LlavaImageProcessor,
    LlavaImageProcessorPil,
    LlavaNextImageProcessor,
    LlavaNextImageProcessorPil,
    LlavaOnevisionImageProcessor,
    LlavaOnevisionImageProcessorPil,
    SiglipImageProcessor,
    SiglipImageProcessorPil,
)

from mmtrt.preprocess.torchvision_transform import SPEC_VERSION
from mmtrt.errors import UserError

# Exact classes, not subclasses: a subclass may override _preprocess (e.g. LLaVA-NeXT tiling).
_SUPPORTED = (
    CLIPImageProcessor,
    CLIPImageProcessorPil,
    LlavaImageProcessor,  # CLIP's pipeline plus optional pad-to-square, refused below via do_pad
    LlavaImageProcessorPil,
    SiglipImageProcessor,
    SiglipImageProcessorPil,
    BitImageProcessor,  # what transformers maps dinov2 checkpoints to
    BitImageProcessorPil,
)
# Any-resolution processors: their do_pad pads the tile count of a batch, which one image at a time never needs.
_TILING = (LlavaNextImageProcessor, LlavaNextImageProcessorPil, LlavaOnevisionImageProcessor,
           LlavaOnevisionImageProcessorPil)

# PIL resample code -> torchvision InterpolationMode value, as transformers' pil_torch_interpolation_mapping;
# box and hamming are absent because torchvision cannot resize tensors with them.
_INTERPOLATION = {
    Resampling.NEAREST: "nearest-exact",
    Resampling.BILINEAR: "bilinear",
    Resampling.BICUBIC: "bicubic",
    Resampling.LANCZOS: "lanczos",
}

# The size forms mmtrt accepts, as SizeDict keys.
_SHORTEST_EDGE = ("shortest_edge",)
_HEIGHT_WIDTH = ("height", "width")


def spec_from_image_processor(image_processor: Any) -> dict[str, Any]:
    """The spec that reproduces image_processor(images)["pixel_values"] for PIL images."""
    ip = image_processor
    name = type(ip).__name__
    tiled = type(ip) in _TILING
    if type(ip) not in _SUPPORTED and not tiled:
        supported = ", ".join(c.__name__ for c in _SUPPORTED + _TILING)
        raise UserError(f"image processor {name} is not supported; use a checkpoint whose processor is one of: {supported}")
    if ip.do_pad and not tiled:
        raise UserError(f"{name} has do_pad=True (padding), which mmtrt does not support; set do_pad to false")
    if ip.data_format not in (None, "channels_first"):
        raise UserError(f"{name} has data_format={ip.data_format!r}; set it to channels_first")
    ops: list[dict[str, Any]] = []
    if ip.do_convert_rgb:
        ops.append({"op": "convert_rgb"})
    output_size = None
    if ip.do_resize:
        size = _size(name, "size", ip.size, (_SHORTEST_EDGE, _HEIGHT_WIDTH))
        interpolation = _interpolation(name, ip.resample)
        # antialias: HF's torchvision backend always resizes with antialias=True.
        ops.append({"op": "resize", "size": size, "interpolation": interpolation, "antialias": True})
        output_size = size if len(size) == 2 else None
    if ip.do_center_crop:
        output_size = _size(name, "crop_size", ip.crop_size, (_HEIGHT_WIDTH,))
        ops.append({"op": "center_crop", "size": output_size})
    if output_size is None:
        raise UserError(
            f"{name} gives an output size that depends on the image; enable do_center_crop or resize to a height and width"
        )
    if ip.do_rescale:
        ops.append({"op": "rescale", "factor": _number(name, "rescale_factor", ip.rescale_factor)})
    if ip.do_normalize:
        mean = _per_channel(name, "image_mean", ip.image_mean)
        ops.append({"op": "normalize", "mean": mean, "std": _per_channel(name, "image_std", ip.image_std)})
    spec = {"version": SPEC_VERSION, "ops": ops, "output_size": output_size}
    if tiled:
        spec["tiling"] = _tiling(name, ip)
    return spec


def _tiling(name: str, ip: Any) -> dict[str, Any]:
    """What LlavaNextImageProcessor._preprocess derives: the tile (crop height, else the size) and the base image's
    size; the resizes for tiling use the processor's resample whatever do_resize says."""
    size = _size(name, "size", ip.size, (_SHORTEST_EDGE, _HEIGHT_WIDTH))
    base = size if len(size) == 2 else size * 2
    crop = dict(ip.crop_size or {})
    side = int(crop["height"]) if crop.get("height") else base[0]
    interpolation = _interpolation(name, ip.resample)
    if interpolation not in ("bicubic", "bilinear"):
        raise UserError(f"{name}.resample is {interpolation}; mmtrt tiles images with bicubic or bilinear resizing")
    pinpoints = [[int(h), int(w)] for h, w in ip.image_grid_pinpoints]
    return {"pinpoints": pinpoints, "tile": [side, side], "base": base, "interpolation": interpolation}


def _size(name: str, field: str, size: Any, forms: tuple[tuple[str, ...], ...]) -> list[int]:
    """[s] for {"shortest_edge": s}, [h, w] for {"height": h, "width": w}; longest_edge, max_height etc. are refused."""
    keys = {k: int(v) for k, v in dict(size or {}).items() if v is not None}
    for form in forms:
        if keys.keys() == set(form):
            return [keys[k] for k in form]
    wanted = " or ".join("{" + ", ".join(f"'{k}': ..." for k in form) + "}" for form in forms)
    raise UserError(f"{name}.{field} is {keys}; mmtrt supports {wanted}")


def _interpolation(name: str, resample: Any) -> str:
    """resample may be a PIL code or, on the torchvision backend, an InterpolationMode."""
    mode = getattr(resample, "value", resample)
    if isinstance(mode, str) and mode in _INTERPOLATION.values():
        return mode
    if isinstance(mode, int) and mode in _INTERPOLATION:
        return _INTERPOLATION[Resampling(mode)]
    raise UserError(f"{name}.resample={resample!r} is not supported; use bicubic, bilinear, nearest or lanczos")


def _number(name: str, field: str, value: Any) -> float:
    if not isinstance(value, (int, float)):
        raise UserError(f"{name}.{field} is {value!r}; set it to a number")
    return float(value)


def _per_channel(name: str, field: str, value: Any) -> list[float]:
    """HF broadcasts a single number over the three channels."""
    values = [value] * 3 if isinstance(value, (int, float)) else list(value or [])
    values = [_number(name, field, v) for v in values]
    if len(values) != 3:
        raise UserError(f"{name}.{field} has {len(values)} values; RGB images need 3")
    return values
