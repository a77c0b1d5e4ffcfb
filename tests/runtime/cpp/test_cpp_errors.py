"""Bad input to the C++ runtime: one line on stderr and exit code 2 from mmtrt-run, a status code and the same
message from the C API, never a crash; the messages are the Python runtime's where it has one."""

import json
import shutil
import subprocess

import pytest
from PIL import Image

from builders import random_image
from cpp_harness import PROGRAM, CApi, needs_build, needs_library, one_line_error, python_message, run_cpp
from mmtrt.runtime import load

pytestmark = needs_build


@pytest.fixture(scope="module")
def pipe(tiny_bundle):
    return load(tiny_bundle, threads=1)


@pytest.fixture
def image(rng, tmp_path):
    path = tmp_path / "image.png"
    random_image(rng, 48, 40).save(path)
    return path


def copy_of(bundle, tmp_path):
    return shutil.copytree(bundle, tmp_path / "copy.bundle")


def test_missing_bundle(tmp_path, image):
    missing = tmp_path / "nothing.bundle"
    assert one_line_error(run_cpp(missing, image, "hi")) == python_message(lambda: load(missing))


@pytest.mark.parametrize("artifact", ["llm.onnx.data", "tokenizer/tokenizer.json", "preprocess.json"])
def test_tampered_artifact_is_named(tiny_bundle, tmp_path, image, artifact):
    copy = copy_of(tiny_bundle, tmp_path)
    data = bytearray((copy / artifact).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / artifact).write_bytes(bytes(data))
    message = one_line_error(run_cpp(copy, image, "hi"))
    assert f"{copy}/{artifact} is missing or does not match its sha256" in message


def test_missing_artifact_is_named(tiny_bundle, tmp_path, image):
    copy = copy_of(tiny_bundle, tmp_path)
    (copy / "vision.onnx.data").unlink()
    assert f"{copy}/vision.onnx.data is missing" in one_line_error(run_cpp(copy, image, "hi"))


def test_other_schema_version(tiny_bundle, tmp_path, image):
    copy = copy_of(tiny_bundle, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["schema_version"] = 99
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert one_line_error(run_cpp(copy, image, "hi")) == python_message(lambda: load(copy))


@pytest.mark.parametrize("key", ["model", "dims", "envelope"])
def test_manifest_without_a_key_it_reads(tiny_bundle, tmp_path, image, key):
    copy = copy_of(tiny_bundle, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest[key]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert f"manifest.json: {key} is missing" in one_line_error(run_cpp(copy, image, "hi"))


def _truncated(rng, folder, fmt):
    path = folder / f"cut.{fmt.lower()}"
    random_image(rng, 64, 64).save(path, format=fmt)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


@pytest.mark.parametrize("kind", ["missing", "folder", "text", "truncated_png", "truncated_jpeg"])
def test_unreadable_image(tiny_bundle, pipe, tmp_path, rng, kind):
    path = {"missing": lambda: tmp_path / "none.png", "folder": lambda: tmp_path,
            "text": lambda: (tmp_path / "notes.png", (tmp_path / "notes.png").write_text("not an image"))[0],
            "truncated_png": lambda: _truncated(rng, tmp_path, "PNG"),
            "truncated_jpeg": lambda: _truncated(rng, tmp_path, "JPEG")}[kind]()
    message = one_line_error(run_cpp(tiny_bundle, path, "hi"))
    theirs = python_message(lambda: pipe.pixel_values(path))
    if kind in ("missing", "folder"):
        assert message == theirs
    else:  # the decoder's own words differ; the frame around them is the same
        assert message.startswith(f"cannot read image {path} (") and message.endswith("); pass a PNG or JPEG file")


def test_an_image_whose_resize_would_be_a_decompression_bomb(tiny_bundle, pipe, tmp_path, rng):
    path = tmp_path / "strip.png"
    random_image(rng, 1, 40000).save(path)
    theirs = python_message(lambda: pipe.pixel_values(path))
    assert "decompression-bomb" in theirs
    assert one_line_error(run_cpp(tiny_bundle, path, "hi")) == theirs


def test_image_outside_the_recipe_s_bounds(tiny_bundle, tmp_path, rng):
    """envelope.image.min_side / max_side bound the user's file only where the recipe sets them."""
    bounded = shutil.copytree(tiny_bundle, tmp_path / "bounded.bundle")
    manifest = json.loads((bounded / "manifest.json").read_text())
    manifest["envelope"]["image"].update(min_side=16, max_side=64)
    (bounded / "manifest.json").write_text(json.dumps(manifest))
    path = tmp_path / "small.png"
    random_image(rng, 8, 30).save(path)
    theirs = python_message(lambda: load(bounded).pixel_values(path))
    assert "accepts sides from 16 to 64" in theirs
    assert one_line_error(run_cpp(bounded, path, "hi")) == theirs


@pytest.mark.parametrize("prompt, extra", [("a" * 300, ()), ("no placeholder", ("--raw-prompt",)),
                                           ("<image><image>", ("--raw-prompt",)), ("hi", ("--max-new-tokens", "0")),
                                           ("hi", ("--max-new-tokens", "33"))])
def test_prompt_outside_the_envelope(tiny_bundle, pipe, image, prompt, extra):
    raw = "--raw-prompt" in extra
    tokens = int(extra[1]) if "--max-new-tokens" in extra else None
    theirs = python_message(lambda: pipe.generate(image, prompt, tokens, raw_prompt=raw))
    assert one_line_error(run_cpp(tiny_bundle, image, prompt, *extra)) == theirs


@pytest.mark.parametrize("args", [[], ["B"], ["B", "--image", "x.png"], ["B", "--image", "x", "--prompt", "p",
                                                                         "--threads", "two"], ["B", "--bogus"]])
def test_bad_arguments(args):
    proc = subprocess.run([str(PROGRAM), *args], capture_output=True, text=True)
    assert proc.returncode == 2 and "mmtrt-run: error: " in proc.stderr and proc.stdout == ""


@needs_library
def test_c_api_status_codes(tiny_bundle, tmp_path, image, pipe):
    api = CApi()
    status, _ = api.load(tmp_path / "nothing")
    assert status == 2 and "is not an mmtrt bundle" in api.error()
    copy = copy_of(tiny_bundle, tmp_path)
    (copy / "embed.onnx.data").write_bytes(b"\0")
    status, _ = api.load(copy)
    assert status == 2 and "embed.onnx.data" in api.error() and "\n" not in api.error()

    status, handle = api.load(tiny_bundle)
    assert status == 0, api.error()
    try:
        (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
        assert api.generate(handle, tmp_path / "bad.png", "hi")[0] == 3
        assert api.error().startswith(f"cannot read image {tmp_path / 'bad.png'} (")
        status, _ = api.generate(handle, image, "x" * 300)
        assert status == 3 and api.error() == python_message(lambda: pipe.prompt_ids("x" * 300))
        status, result = api.generate(handle, image, "hi", 5)  # the handle still works after bad input
        assert status == 0 and result["token_ids"] == pipe.generate(image, "hi", 5).token_ids
    finally:
        api.free(handle)
