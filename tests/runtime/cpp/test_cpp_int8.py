"""The C++ runtime runs int8 vision graphs as the Python runtime does: weight-only (a per-channel int8
DequantizeLinear without a zero point, which ONNX Runtime's exact-products entry breaks, so neither runtime sets it
there) and with activations quantized per token (uint8 x int8 GEMMs, exact on every host in both)."""

import pytest

from builders import random_image
from conftest import compile_to
from cpp_harness import generate_cpp, needs_build
from mmtrt.runtime import load

pytestmark = needs_build


@pytest.fixture(scope="module", params=["float", "per_token"])
def bundle(request, tmp_path_factory):
    recipe = ("model: {source: zoo, name: tiny-llava}\npasses:\n"
              f"  - int8_weights: {{components: [vision], activations: {request.param}}}\n")
    return compile_to(tmp_path_factory.mktemp(f"int8-{request.param}"), recipe)


def test_tokens_and_text_equal_the_python_runtime(bundle, rng, tmp_path):
    image = tmp_path / "image.png"
    random_image(rng, int(rng.integers(24, 140)), int(rng.integers(24, 140))).save(image)
    ours = generate_cpp(bundle, image, "What is in the picture?", "--max-new-tokens", "12")
    theirs = load(bundle, threads=1).generate(image, "What is in the picture?", max_new_tokens=12).to_json()
    assert ours["token_ids"] == theirs["token_ids"] and ours["text"] == theirs["text"]
