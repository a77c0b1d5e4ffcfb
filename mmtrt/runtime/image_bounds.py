"""Which user images a bundle takes. The preprocessing resizes any image to the model's input, so the envelope
bounds the preprocessed tensor (its fixed shape is checked with every vision call), not the user's file; a recipe
may still bound the file's sides (`envelope.image.min_side` / `max_side`). Two guards stay whatever the recipe
says: PIL's decompression-bomb limit when the file is decoded, and the same pixel limit on the image the resize
step would make (a 1 x 100000 strip resized to a short side of 224 would be 224 x 22 million pixels)."""

from __future__ import annotations

from typing import Any

from PIL import Image

from mmtrt.errors import UserError


def check_image(img: Image.Image, bounds: dict[str, Any], spec: dict[str, Any]) -> None:
    width, height = img.size
    lo, hi = bounds.get("min_side"), bounds.get("max_side")
    if (lo and min(width, height) < lo) or (hi and max(width, height) > hi):
        raise UserError(f"image is {width}x{height}; this bundle's recipe accepts sides from {lo or 1} to "
                        f"{hi or 'any size'} pixels; resize it or recompile with a wider envelope.image")
    limit = Image.MAX_IMAGE_PIXELS
    if "tiling" in spec:  # tiling resizes into the model's largest grid at most; its ops run on tiles
        return
    for op in spec["ops"]:
        if op["op"] == "resize" and len(op["size"]) == 1 and limit:
            scale = op["size"][0] / min(width, height)
            resized = (round(width * scale), round(height * scale))
            if resized[0] * resized[1] > limit:
                raise UserError(f"image is {width}x{height}; preprocessing resizes its short side to {op['size'][0]}, "
                                f"giving {resized[0]}x{resized[1]} pixels, more than the decompression-bomb limit "
                                f"of {limit}; crop it closer to square")
