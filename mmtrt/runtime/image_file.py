"""A user's image file as the model should see it: the decoded pixels turned and scaled as a viewer shows them."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageOps


def upright_8bit(img: Image.Image) -> Image.Image:
    """The image as a viewer shows it: turned by its EXIF orientation, as transformers' `load_image` does
    (ImageOps.exif_transpose), and 16-bit grey scaled to 8 bits by its high byte, as PIL does for 16-bit colour
    (a plain convert clips every value above 255 to white)."""
    img = ImageOps.exif_transpose(img)
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        wide = np.asarray(img, dtype=np.int64)
        if img.mode != "I" or wide.max(initial=0) > 255:
            img = Image.fromarray((np.clip(wide, 0, 65535) >> 8).astype(np.uint8), "L")
    return img
