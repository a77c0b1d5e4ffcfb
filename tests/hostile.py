"""Hostile inputs a client can send a server, by kind: image bytes that trip PIL's decoders in each way they fail
(a broken chunk: SyntaxError; a huge text chunk, a bad PPM header: ValueError; a truncated file: OSError), JSON
that trips Python's parser (deep nesting: RecursionError; a 5,000-digit integer: ValueError), and the chat bodies
that carry them. Used by the serving tests, the fuzz test and scripts/bench_robustness.py."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
from PIL import Image


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def noise(rng, height: int = 40, width: int = 60) -> Image.Image:
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _pieces(data: bytes) -> tuple[bytes, bytes]:
    """The PNG's header chunks (signature, IHDR, ...) and its image data, IDAT chunks joined."""
    at, head, idat = 8, data[:8], b""
    while at < len(data):
        n = struct.unpack(">I", data[at:at + 4])[0]
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + n]
        if kind == b"IDAT":
            idat += body
        elif kind != b"IEND":
            head += chunk(kind, body)
        at += 12 + n
    return head, idat


def broken_chunk_png(rng) -> bytes:
    """A PNG whose second IDAT chunk has a type that is no chunk's (PIL: SyntaxError at load)."""
    head, idat = _pieces(png(noise(rng)))
    half = len(idat) // 2
    return (head + chunk(b"IDAT", idat[:half]) + struct.pack(">I", len(idat) - half) + b"\x00\x01\x02\x03" +
            idat[half:] + b"\0\0\0\0" + chunk(b"IEND", b""))


def text_chunk_png(rng, size: int = 4 * 2**20) -> bytes:
    """A PNG with a compressed text chunk of `size` bytes (PIL: ValueError past MAX_TEXT_CHUNK)."""
    head, idat = _pieces(png(noise(rng)))
    return head + chunk(b"zTXt", b"k\0\0" + zlib.compress(b"x" * size)) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def bad_ppm() -> bytes:
    return b"P6\n30 abc\n255\n" + b"\0" * 100


def truncated_png(rng) -> bytes:
    return png(noise(rng))[:80]


def large_png(width: int, height: int) -> bytes:
    """A PNG of one colour: small on the wire, `width` x `height` pixels once decoded."""
    return png(Image.new("RGB", (width, height), (90, 120, 30)))


BAD_IMAGES = {"broken PNG chunk": broken_chunk_png, "4 MiB PNG text chunk": text_chunk_png,
              "bad PPM header": lambda rng: bad_ppm(), "truncated PNG": truncated_png}


def data_uri(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def with_images(model: str, urls: list[str], text: str = "What is it?", max_tokens: int = 4) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]}


def deep_json(depth: int = 10_000) -> bytes:
    return b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"


def huge_int_json(model: str, digits: int = 5000) -> bytes:
    return (f'{{"model": "{model}", "max_tokens": 1{"0" * digits}, '
            '"messages": [{"role": "user", "content": "hi"}]}').encode()
