"""Wrong pixels: an EXIF-rotated photo runs upright, as transformers' load_image turns it, and a 16-bit PNG runs
as its high bytes, in both runtimes (the C++ runtime's pixels equal the Python runtime's exactly)."""

import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from builders import random_image
from cpp_harness import CApi, needs_library
from mmtrt.runtime import load


@pytest.fixture(scope="module")
def pipe(tiny_bundle):
    return load(tiny_bundle, threads=1)


def png16(path, values: np.ndarray) -> None:
    """A 16-bit PNG (grey [H, W] or RGB [H, W, 3]) written by hand: PIL writes no 16-bit colour PNG."""
    colour = 2 if values.ndim == 3 else 0
    rows = values.astype(">u2").reshape(values.shape[0], -1).tobytes()
    stride = len(rows) // values.shape[0]
    raw = b"".join(b"\0" + rows[i * stride:(i + 1) * stride] for i in range(values.shape[0]))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", values.shape[1], values.shape[0], 16, colour, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) +
                     chunk(b"IEND", b""))


@pytest.mark.parametrize("shape", [(37, 53), (37, 53, 3)])
def test_a_16_bit_png_runs_as_its_high_bytes(pipe, tmp_path, rng, shape):
    values = rng.integers(0, 65536, shape, dtype=np.uint16)
    png16(tmp_path / "deep.png", values)
    reference = Image.fromarray((values >> 8).astype(np.uint8))  # numpy's own reduction to 8 bits
    ours = pipe.pixel_values(tmp_path / "deep.png")
    assert np.array_equal(ours, pipe.pixel_values(reference))
    assert (ours == ours.max()).mean() < 0.05  # not the white page a plain convert gives


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_as_transformers_load_image(pipe, tmp_path, rng, orientation):
    from transformers.image_utils import load_image

    path = tmp_path / "photo.jpg"
    exif = Image.Exif()
    exif[0x0112] = orientation
    random_image(rng, 30, 52).save(path, quality=95, exif=exif)
    assert np.array_equal(pipe.pixel_values(path), pipe.pixel_values(load_image(str(path))))


@needs_library
def test_the_cpp_runtime_sees_the_same_pixels(tiny_bundle, pipe, tmp_path, rng):
    api = CApi()
    status, handle = api.load(tiny_bundle)
    assert status == 0, api.error()
    try:
        files = []
        for orientation in range(1, 9):
            exif = Image.Exif()
            exif[0x0112] = orientation
            for fmt in ("JPEG", "PNG"):
                files.append(tmp_path / f"o{orientation}.{fmt.lower()}")
                random_image(rng, 30, 52).save(files[-1], format=fmt, exif=exif)
        for shape in ((37, 53), (37, 53, 3)):
            files.append(tmp_path / f"deep{len(shape)}.png")
            png16(files[-1], rng.integers(0, 65536, shape, dtype=np.uint16))
        for file in files:
            status, ours = api.pixel_values(handle, file)
            assert status == 0, api.error()
            assert np.array_equal(ours, pipe.pixel_values(file).ravel()), file.name
    finally:
        api.free(handle)
