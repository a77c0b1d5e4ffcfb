"""What one request may hold, checked before the work it would cost: the body's bytes before it is parsed, the
text's characters before it is tokenized, the count of images before any is decoded, and each image's pixels from
its header before its pixels are. Parsing, decoding and tokenizing then run on a small pool of threads, off the
event loop that answers every client (and /health).

The defaults take any request a bundle's envelope admits with room to spare (a few inline photos fit the body;
32,768 characters are more than an envelope's prompt tokens take) while a hostile one costs a bounded time.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mmtrt.errors import UserError


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 32 * 2**20
    max_text_chars: int = 32_768
    max_image_pixels: int = 4096 * 4096
    max_image_file_bytes: int = 32 * 2**20
    prepare_threads: int = 4

    def images(self, allowed):
        """The ImageSource that reads `allowed` (None: data: URIs only) within these limits."""
        from mmtrt.runtime.image_source import ImageSource

        return ImageSource(allowed, self.max_image_pixels, self.max_image_file_bytes)

    def pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self.prepare_threads, thread_name_prefix="mmtrt-prepare")

    def check_body(self, size: int) -> None:
        if size > self.max_body_bytes:
            raise TooLarge(f"the request body is over {self.max_body_bytes} bytes, the most this server reads "
                           "(--max-body-bytes); send smaller images or less text")


class TooLarge(UserError):
    """A request over a size limit (HTTP 413)."""


def add_arguments(parser, positive_int) -> None:
    """The limits as `mmtrt serve` options."""
    d = Limits()
    options = (
        ("--max-body-bytes", d.max_body_bytes, "the most bytes a request body may hold; a larger one is refused with "
         "HTTP 413"),
        ("--max-text-chars", d.max_text_chars, "the most characters of text a request's messages may hold, counted "
         "before tokenizing"),
        ("--max-image-pixels", d.max_image_pixels, "the most pixels (width x height) an image may have, read from its "
         "header before it is decoded"),
        ("--max-image-file-bytes", d.max_image_file_bytes, "the most bytes read from an --allow-images file"),
        ("--prepare-threads", d.prepare_threads, "threads that parse, decode and tokenize requests off the event loop"))
    for flag, default, text in options:
        parser.add_argument(flag, type=positive_int, default=default, metavar="N", help=f"{text} (default {default})")


def from_arguments(args) -> Limits:
    return Limits(**{name: getattr(args, name) for name in Limits.__dataclass_fields__})
