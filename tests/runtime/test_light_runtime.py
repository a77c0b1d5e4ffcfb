"""The runtime path without torch or transformers: same prompts, pixels and tokens as the transformers-based path."""

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from transformers import AutoTokenizer

from mmtrt.preprocess.numpy_transform import build_transform
from mmtrt.preprocess.torchvision_transform import build_transform as torchvision_transform
from mmtrt.runtime import load
from mmtrt.runtime.tokenizer import BundleTokenizer

CHILD = """
import json, sys
import numpy as np
from PIL import Image
from mmtrt.runtime import load
bundle, image, prompt, pixels = sys.argv[1:5]
pipe = load(bundle, threads=1)
g = pipe.generate(image, prompt, max_new_tokens=6)
np.save(pixels, pipe.pixel_values(image))
print(json.dumps({"ids": pipe.prompt_ids(prompt), "tokens": g.token_ids, "text": g.text,
                  "preprocess": g.backends["preprocess"],
                  "heavy": sorted(m for m in ("torch", "torchvision", "transformers", "onnx") if m in sys.modules)}))
"""


def conversations(rng):
    words = ["a", "cat", "Über", "✓", " spaced  out ", "<image>", "line\nbreak", "{{ not jinja }}", "ok."]
    text = lambda: " ".join(rng.choice(words, int(rng.integers(1, 8))))  # noqa: E731
    return [
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text()}]}],
        [{"role": "user", "content": [{"type": "text", "text": text()}]}],
        [{"role": "system", "content": text()}, {"role": "user", "content": text()},
         {"role": "assistant", "content": text()}, {"role": "user", "content": [{"type": "image"},
                                                                                  {"type": "text", "text": text()}]}],
    ]


@pytest.fixture(scope="module", params=["tiny", "siglip", "tiny_prefill"])
def bundle(request):
    return request.getfixturevalue(f"{request.param}_bundle")


def test_generate_imports_no_torch_and_matches_transformers(bundle, tmp_path, rng):
    image = tmp_path / "image.png"
    Image.fromarray(rng.integers(0, 256, (int(rng.integers(30, 120)), int(rng.integers(30, 120)), 3),
                                 dtype=np.uint8)).save(image)
    prompt = " ".join(rng.choice(["what", "is", "this", "colour", "Über", "?"], 5))
    run = subprocess.run([sys.executable, "-c", CHILD, str(bundle), str(image), prompt, str(tmp_path / "pixels.npy")],
                         capture_output=True, text=True, check=True)
    child = json.loads(run.stdout)
    assert child["heavy"] == [] and child["preprocess"] == "numpy"

    pipe = load(bundle, threads=1)  # the same pipeline with transformers' tokenizer and torchvision's transform
    pipe.tokenizer = AutoTokenizer.from_pretrained(bundle / "tokenizer")
    transform = torchvision_transform(pipe.preprocess_spec)
    pipe.transform = lambda img: transform(img).numpy()
    reference = pipe.generate(image, prompt, max_new_tokens=6)
    assert child["ids"] == pipe.prompt_ids(prompt)
    np.testing.assert_array_equal(np.load(tmp_path / "pixels.npy"), pipe.pixel_values(image))
    assert (child["tokens"], child["text"]) == (reference.token_ids, reference.text)


def test_chat_template_encode_decode_match_transformers(bundle, rng):
    ours, theirs = BundleTokenizer(bundle / "tokenizer"), AutoTokenizer.from_pretrained(bundle / "tokenizer")
    template = json.loads((bundle / "manifest.json").read_text())["model"]["chat_template"]
    for conversation in conversations(rng):
        for generation in (True, False):
            assert ours.apply_chat_template(conversation, template, add_generation_prompt=generation) == \
                theirs.apply_chat_template(conversation, chat_template=template, add_generation_prompt=generation,
                                           tokenize=False)
    assert len(ours) == len(theirs) and ours.bos_token == theirs.bos_token
    for _ in range(20):
        ids = rng.integers(0, len(theirs), int(rng.integers(1, 30))).tolist()
        text = theirs.decode(ids)
        for flag in (True, False):
            assert ours.decode(ids, skip_special_tokens=flag) == theirs.decode(ids, skip_special_tokens=flag)
            assert ours(text, add_special_tokens=flag)["input_ids"] == theirs(text, add_special_tokens=flag)["input_ids"]


SPEC = {"version": 1, "output_size": [40, 40], "ops": [
    {"op": "convert_rgb"}, {"op": "resize", "size": [40], "interpolation": "bicubic", "antialias": True},
    {"op": "center_crop", "size": [40, 40]}, {"op": "rescale", "factor": 1 / 255},
    {"op": "normalize", "mean": [0.48, 0.46, 0.41], "std": [0.27, 0.26, 0.28]}]}


@pytest.mark.parametrize("interpolation,size,crop", [("bicubic", [40], [40, 40]), ("bilinear", [40], [40, 40]),
                                                     ("bilinear", [33, 57], [36, 31]), ("nearest-exact", [40], [44, 40])])
def test_numpy_preprocessing_equals_torchvision(interpolation, size, crop, rng):
    spec = json.loads(json.dumps(SPEC))
    spec["ops"][1].update(interpolation=interpolation, size=size)
    spec["ops"][2]["size"] = crop
    ours, theirs = build_transform(spec), torchvision_transform(spec)
    for height, width in [(480, 640), (17, 93), (40, 40), (41, 39), (301, 1000), (5, 200)]:
        pixels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
        for image in (Image.fromarray(pixels[..., :3]), Image.fromarray(pixels, "RGBA"),
                      Image.fromarray(pixels[..., 0]).convert("P")):
            np.testing.assert_array_equal(ours(image), theirs(image).numpy(), err_msg=f"{height}x{width} {image.mode}")
