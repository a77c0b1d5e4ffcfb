"""Where a served request's images may come from: `data:` URIs, and regular files inside one allow-list folder.

A client names a file by a path (relative ones are taken inside the folder) or a `file://` URL. The path must stay
inside the folder both as written and once its symbolic links are resolved; the file is then opened one folder at
a time beneath the allow-list's own descriptor without following a link (a link swapped in meanwhile is refused),
without blocking (a FIFO or a device is refused, never read), and must be a regular file. Every refusal names the
request's own text only: never the server's folders, and never whether something exists outside the allow-list.
"""

from __future__ import annotations

import base64
import binascii
import errno
import io
import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlparse

from PIL import Image

from mmtrt.errors import UserError
from mmtrt.runtime.image_file import open_image

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def load_data_uri(url: str, max_pixels: int | None = None) -> Image.Image:
    """An image from a `data:image/...;base64,` URI; anything else (a file path, a web address) is refused.
    `max_pixels`: refuse a larger image before decoding it (None: PIL's decompression-bomb limit only)."""
    if not url.startswith("data:"):
        raise UserError(f"image url {url[:40]!r} is not a data: URI; send the image inline as "
                        "data:image/png;base64,...")
    header, _, payload = url.partition(",")
    if not header.endswith(";base64"):
        raise UserError("an image data: URI must be base64 (data:image/png;base64,...)")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise UserError("the image data: URI is not valid base64") from None
    return open_image(io.BytesIO(raw), "the data: URI's image", max_pixels)


class ImageSource:
    """Opens an image a client names: a `data:` URI, or a file inside `allowed` (None: no files) of at most
    `max_file_bytes`; an image of more than `max_pixels` is refused before it is decoded (serve/limits.py gives
    the server's; None: no limit of its own)."""

    def __init__(self, allowed: Path | None, max_pixels: int | None = None, max_file_bytes: int | None = None):
        self.given = os.path.abspath(allowed) if allowed else None
        self.allowed = os.path.realpath(allowed) if allowed else None
        self.max_pixels, self.max_file_bytes = max_pixels, max_file_bytes

    def __call__(self, value) -> Image.Image:
        if not isinstance(value, str):
            raise UserError(f"an image is a string (a data: URI or a file path), not {type(value).__name__}")
        if value.startswith("data:"):
            return load_data_uri(value, self.max_pixels)
        label = repr(value[:60])
        try:
            parsed = urlparse(value)
        except ValueError:
            raise UserError(f"image {label} is neither a data: URI nor a file path") from None
        if parsed.scheme not in ("", "file"):
            raise UserError(f"image url {label} is refused: this server reads data: URIs and files in its "
                            "allow-list folder only, and never fetches web addresses")
        if self.allowed is None:
            raise UserError("image files are refused: this server was started without --allow-images; send the "
                            "image as a data:image/png;base64,... URI")
        name = unquote(parsed.path) if parsed.scheme == "file" else value
        raw = self.read(name, label)
        return open_image(io.BytesIO(raw), label, self.max_pixels)

    def read(self, name: str, label: str) -> bytes:
        """The bytes of the regular file `name` inside the allow-list (relative: to the folder)."""
        if "\0" in name:
            raise UserError(f"image {label} holds a NUL byte; name a file in the server's image folder")
        outside = UserError(f"image {label} is not a file in this server's image folder; name one inside it (a path "
                            "relative to it works) or send the image as a data: URI")
        joined = os.path.join(self.allowed, name)
        lexical = os.path.normpath(joined)
        if not (_inside(lexical, self.allowed) or _inside(lexical, self.given)):
            raise outside
        try:
            real = os.path.realpath(joined)
        except OSError:
            raise outside from None
        if not _inside(real, self.allowed):
            raise outside
        try:
            return self._read_beneath(os.path.relpath(real, self.allowed), label)
        except FileNotFoundError:
            raise UserError(f"image {label} does not exist in this server's image folder; check the name") from None
        except NotADirectoryError:
            raise UserError(f"image {label} does not exist in this server's image folder; check the name") from None
        except PermissionError:
            raise UserError(f"image {label} cannot be read by the server (permission denied)") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):  # a link swapped in after the check
                raise outside from None
            raise UserError(f"image {label} cannot be read ({os.strerror(exc.errno or 0)})") from None

    def _read_beneath(self, relative: str, label: str) -> bytes:
        parts = [] if relative == "." else relative.split(os.sep)
        folder = os.open(self.allowed, _DIR_FLAGS)
        try:
            for part in parts[:-1]:
                inner = os.open(part, _DIR_FLAGS, dir_fd=folder)
                os.close(folder)
                folder = inner
            mode = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False).st_mode if parts else stat.S_IFDIR
            _check_regular(mode, label)
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=folder)
        finally:
            os.close(folder)
        with os.fdopen(fd, "rb") as file:
            _check_regular(os.fstat(file.fileno()).st_mode, label)  # what was opened, not what was looked at
            raw = file.read() if self.max_file_bytes is None else file.read(self.max_file_bytes + 1)
        if self.max_file_bytes is not None and len(raw) > self.max_file_bytes:
            raise UserError(f"image {label} is over {self.max_file_bytes} bytes, the most this server reads from an "
                            "image file; send a smaller image")
        return raw


def _check_regular(mode: int, label: str) -> None:
    if stat.S_ISDIR(mode):
        raise UserError(f"image {label} is a folder, not an image file; name a PNG or JPEG file in it")
    if not stat.S_ISREG(mode):
        raise UserError(f"image {label} is not a regular file (a pipe, socket, device or link); name an image file")


def _inside(path: str | None, folder: str | None) -> bool:
    return bool(path and folder) and (path == folder or path.startswith(folder.rstrip(os.sep) + os.sep))
