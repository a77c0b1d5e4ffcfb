"""The digits task: scikit-learn's 1,797 labelled 8x8 digits, upscaled, asked about in a fixed prompt.

The train/held-out split is fixed (stratified, seed 0), shared by scripts/train_projector.py and the eval suite.
A digit is always drawn at SIDE px; a model whose input is larger sees it in the middle of a white page of its
input size (`page`), as an object sits in part of a photo, so that most of its image tokens show blank paper.
"""

from __future__ import annotations

import re
from functools import cache

import numpy as np
from PIL import Image

from mmtrt.errors import UserError

PROMPT = "Which digit is shown?"
HELDOUT = 500
SPLIT_SEED = 0
SIDE = 112


@cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise UserError("the digits suite needs scikit-learn; pip install scikit-learn (or make zoo-extras)") from None
    data = load_digits()
    return data.images, data.target


def split_indices(split: str) -> np.ndarray:
    """Indices of the `train` or `heldout` split: a stratified draw of HELDOUT images with a fixed seed."""
    _, labels = _digits()
    rng = np.random.default_rng(SPLIT_SEED)
    heldout = np.sort(np.concatenate([
        rng.permutation(np.flatnonzero(labels == d))[: round(HELDOUT * np.mean(labels == d))] for d in range(10)]))
    if split == "heldout":
        return heldout
    if split == "train":
        return np.setdiff1d(np.arange(len(labels)), heldout)
    raise ValueError(split)


def digit_image(pixels: np.ndarray, page: int = SIDE) -> Image.Image:
    """An 8x8 digit (values 0..16) as a SIDE px RGB image, dark ink on white as on paper, centred on a white
    page x page image when page is larger."""
    gray = (255 - np.asarray(pixels) * (255 / 16)).clip(0, 255).astype(np.uint8)
    digit = Image.fromarray(gray, "L").resize((SIDE, SIDE), Image.Resampling.BILINEAR)
    if page <= SIDE:
        return digit.convert("RGB")
    sheet = Image.new("L", (page, page), 255)
    sheet.paste(digit, ((page - SIDE) // 2, (page - SIDE) // 2))
    return sheet.convert("RGB")


def samples(split: str, limit: int | None = None, page: int = SIDE) -> list[tuple[Image.Image, int]]:
    images, labels = _digits()
    idx = split_indices(split)[:limit]
    return [(digit_image(images[i], page), int(labels[i])) for i in idx]


def parse_answer(text: str) -> int | None:
    """The first digit in the generated text, or None when it names none."""
    match = re.search(r"\d", text)
    return int(match.group()) if match else None
