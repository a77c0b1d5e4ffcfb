"""The C++ runtime (build/cpp) generates what the Python runtime generates, from the same bundle and files."""

import subprocess

import numpy as np
import pytest
from PIL import Image

from builders import random_image
from cpp_harness import PROGRAM, needs_build, needs_library, generate_cpp, CApi
from mmtrt.runtime import load

pytestmark = needs_build

PROMPTS = ["What is in the picture?", "Describe the colours, then count the objects.", "héllo wörld ☃ 数字 😀?"]
# (height, width, format): upscaled, downscaled, square, JPEG chroma subsampling and odd sizes.
CASES = [(90, 120, "PNG"), (37, 211, "JPEG"), (64, 64, "PNG"), (201, 75, "JPEG")]
NEW_TOKENS = 12


@pytest.fixture(scope="module", params=["tiny_bundle", "siglip_bundle"])
def bundle(request):
    path = request.getfixturevalue(request.param)
    return path, load(path, threads=1)


def save(image: Image.Image, folder, name, fmt="PNG"):
    path = folder / f"{name}.{fmt.lower()}"
    image.save(path, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return path


@pytest.mark.parametrize("index", range(len(CASES)))
def test_greedy_tokens_and_text_match_the_python_runtime(bundle, index, rng, tmp_path):
    path, pipe = bundle
    height, width, fmt = CASES[index]
    image = save(random_image(rng, height, width), tmp_path, "image", fmt)
    prompt = PROMPTS[index % len(PROMPTS)]
    ours = generate_cpp(path, image, prompt, "--max-new-tokens", str(NEW_TOKENS))
    theirs = pipe.generate(image, prompt, max_new_tokens=NEW_TOKENS).to_json()
    assert ours["token_ids"] == theirs["token_ids"]
    assert ours["text"] == theirs["text"]
    assert ours["prompt_tokens"] == theirs["prompt_tokens"]
    assert ours.keys() == theirs.keys() and ours["timings"].keys() == theirs["timings"].keys()
    assert ours["backends"].keys() == theirs["backends"].keys()
    assert ours["fallbacks"].keys() == theirs["fallbacks"].keys()


def test_raw_prompt_and_default_token_budget_match(bundle, rng, tmp_path):
    path, pipe = bundle
    image = save(random_image(rng, 70, 50), tmp_path, "image")
    prompt = "<image>\nUSER: what now?"
    ours = generate_cpp(path, image, prompt, "--raw-prompt")
    theirs = pipe.generate(image, prompt, raw_prompt=True).to_json()
    assert ours["token_ids"] == theirs["token_ids"] and ours["text"] == theirs["text"]


def test_text_output_without_json(bundle, rng, tmp_path):
    path, pipe = bundle
    image = save(random_image(rng, 40, 40), tmp_path, "image")
    proc = subprocess.run([str(PROGRAM), str(path), "--image", str(image), "--prompt", "hi", "--max-new-tokens", "3",
                           "--threads", "1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == pipe.generate(image, "hi", max_new_tokens=3).text + "\n"
    assert proc.stderr.startswith("preprocess_ms=")


def test_the_unit_tests_pass():
    proc = subprocess.run([str(PROGRAM.parent / "mmtrt-unit-tests")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _variants(rng):
    """Images in the modes PIL opens from PNG and JPEG files, each with what convert_rgb does to it."""
    base = random_image(rng, 53, 97)
    alpha = Image.fromarray(rng.integers(0, 256, (53, 97), dtype=np.uint8))
    rgba = base.copy()
    rgba.putalpha(alpha)
    return {"rgb": (base, "PNG"), "jpeg": (base, "JPEG"), "rgba": (rgba, "PNG"), "gray": (base.convert("L"), "PNG"),
            "gray_alpha": (rgba.convert("LA"), "PNG"), "palette": (base.convert("P"), "PNG"),
            "gray_jpeg": (base.convert("L"), "JPEG"), "big": (random_image(rng, 300, 170), "JPEG"),
            "tiny": (random_image(rng, 16, 21), "PNG")}


@needs_library
def test_preprocessing_is_pixel_exact(bundle, rng, tmp_path):
    """The uint8 resize is torch's kernel ported, JPEG is libjpeg like PIL's: equal to the last float bit."""
    path, pipe = bundle
    api = CApi()
    status, handle = api.load(path)
    assert status == 0, api.error()
    try:
        for name, (image, fmt) in _variants(rng).items():
            file = save(image, tmp_path, name, fmt)
            status, ours = api.pixel_values(handle, file)
            assert status == 0, api.error()
            theirs = pipe.pixel_values(file).ravel()
            assert ours.shape == theirs.shape, name
            assert np.array_equal(ours, theirs), f"{name}: max |diff| {np.abs(ours - theirs).max()}"
    finally:
        api.free(handle)


def _random_text(rng, length):
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x4E00, 0x4FFF), (0x1F600, 0x1F64F), (0x0A, 0x0A)]
    picks = rng.integers(0, len(ranges), length)
    return "".join(chr(int(rng.integers(ranges[p][0], ranges[p][1] + 1))) for p in picks)


@needs_library
def test_prompt_ids_and_decode_match_transformers(bundle, rng):
    path, pipe = bundle
    api = CApi()
    status, handle = api.load(path)
    assert status == 0, api.error()
    try:
        for length in (1, 7, 25, 50):
            prompt = _random_text(rng, length)
            assert api.prompt_ids(handle, prompt) == (0, pipe.prompt_ids(prompt)), prompt
            raw = prompt[: length // 2] + "<image>" + prompt[length // 2:]
            assert api.prompt_ids(handle, raw, raw=True) == (0, pipe.prompt_ids(raw, raw_prompt=True)), raw
        vocab = len(pipe.tokenizer)
        for length in (0, 1, 5, 30, 200):
            ids = rng.integers(0, vocab, length).tolist()
            assert api.decode(handle, ids) == pipe.tokenizer.decode(ids, skip_special_tokens=True), ids
    finally:
        api.free(handle)
