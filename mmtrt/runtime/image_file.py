"""A user's image file as the model should see it: the decoded pixels turned and scaled as a viewer shows them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from mmtrt.errors import UserError


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


def open_image(image, name: str | None = None, max_pixels: int | None = None) -> Image.Image:
    """A PIL image from itself, a path or a binary file object; `name` stands for it in messages. `max_pixels`
    refuses a larger image from its header, before its pixels are decoded."""
    if isinstance(image, Image.Image):
        return image
    if not isinstance(image, (str, Path)) and not hasattr(image, "read"):
        raise UserError(f"image must be a file path or a PIL image, not {type(image).__name__}")
    label = name or image
    try:
        with Image.open(image) as img:
            if max_pixels and img.width * img.height > max_pixels:
                raise UserError(f"image {label} is {img.width}x{img.height} pixels, more than the {max_pixels} this "
                                "server decodes; send a smaller image")
            img.load()
            return upright_8bit(img)
    except UserError:
        raise
    except IsADirectoryError:
        raise UserError(f"image {label} is a folder, not an image file; pass the path of a PNG or JPEG file") from None
    except FileNotFoundError:
        raise UserError(f"image {label} does not exist; pass the path of a PNG or JPEG file") from None
    except Image.DecompressionBombError as exc:
        raise UserError(f"image {label} is refused as a decompression bomb ({exc}); pass a smaller image") from None
    except UnidentifiedImageError:
        raise UserError(f"cannot read image {label} (not an image format PIL reads); pass a PNG or JPEG file") from None
    except Exception as exc:  # PIL's plugins raise OSError, ValueError, SyntaxError, struct.error... on bad files
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise UserError(f"cannot read image {label} ({reason}); pass a PNG or JPEG file") from None
