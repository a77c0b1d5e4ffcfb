"""Runs a preprocessing spec (see mmtrt.ir.preprocess) as a TorchVision transforms v2 pipeline.

The pipeline repeats the Hugging Face torchvision-backed image processor step for step (resize on uint8,
int-anchored crop, rescale folded into normalize), so it reproduces the processor's output rather than
approximating it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as tvF

from mmtrt.preprocess.numpy_transform import SPEC_VERSION, convert_rgb, ops_by_name

__all__ = ["SPEC_VERSION", "build_transform", "convert_rgb", "preprocess"]


class CenterCrop(v2.Transform):
    """Center crop anchored at int((side - crop) / 2) like the HF processors; v2.CenterCrop rounds instead,
    one pixel off whenever the margin is odd. A crop larger than the image pads with zeros, the odd pixel on
    the bottom/right like HF's torchvision backend (its PIL backend puts it top/left)."""

    _transformed_types = (torch.Tensor,)

    def __init__(self, size: list[int]):
        super().__init__()
        self.size = list(size)

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        height, width = inpt.shape[-2:]
        crop_h, crop_w = self.size
        return tvF.crop(inpt, int((height - crop_h) / 2), int((width - crop_w) / 2), crop_h, crop_w)


class Rescale(v2.Transform):
    """Multiplies by any factor; v2.ToDtype(scale=True) can only divide by the dtype's maximum."""

    _transformed_types = (torch.Tensor,)

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return inpt * self.factor


def _normalize(op: dict[str, Any], rescale: float) -> v2.Normalize:
    """Divides the rescale factor into mean and std in float32, as the HF torchvision backend fuses them."""
    mean = torch.tensor(op["mean"], dtype=torch.float32) * (1.0 / rescale)
    std = torch.tensor(op["std"], dtype=torch.float32) * (1.0 / rescale)
    return v2.Normalize(mean.tolist(), std.tolist())


def build_transform(spec: dict[str, Any]) -> v2.Compose:
    """PIL image in, float32 [3, H, W] tensor out. Geometry runs on uint8, as in the processor."""
    ops = ops_by_name(spec)
    steps: list[v2.Transform] = []
    if "convert_rgb" in ops:
        steps.append(v2.Lambda(convert_rgb, Image.Image))
    steps.append(v2.ToImage())
    if "resize" in ops:
        op = ops["resize"]
        mode = v2.InterpolationMode(op["interpolation"])
        steps.append(v2.Resize(op["size"], interpolation=mode, antialias=op["antialias"]))
    if "center_crop" in ops:
        steps.append(CenterCrop(ops["center_crop"]["size"]))
    steps.append(v2.ToDtype(torch.float32))
    if "normalize" in ops:
        steps.append(_normalize(ops["normalize"], ops.get("rescale", {"factor": 1.0})["factor"]))
    elif "rescale" in ops:
        steps.append(Rescale(ops["rescale"]["factor"]))
    return v2.Compose(steps)


def preprocess(spec: dict[str, Any], images: list[Image.Image]) -> np.ndarray:
    """The processor's pixel_values for a list of PIL images: float32 [N, 3, H, W]."""
    transform = build_transform(spec)
    return torch.stack([transform(image) for image in images]).numpy()
