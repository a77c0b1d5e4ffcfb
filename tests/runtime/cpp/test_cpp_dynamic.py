"""The C++ runtime on a bundle with a dynamic token budget (token_prune budget: dynamic): each image's placeholder
becomes its own kept count, so `mmtrt-run --json` gives the image_tokens, token ids and text `mmtrt run --json` does."""

import json

import pytest

from builders import random_image
from conftest import compile_to
from cpp_harness import generate_cpp, needs_build
from mmtrt.cli import main
from token_prune_graphs import dynamic_tiny_recipe

pytestmark = needs_build
PROMPT = "What is in the picture?"


@pytest.fixture(scope="module")
def dynamic_bundle(tmp_path_factory):
    return compile_to(*dynamic_tiny_recipe(tmp_path_factory.mktemp("cpp-dynamic")))


def python_json(bundle, image, capsys) -> dict:
    assert main(["run", str(bundle), "--image", str(image), "--prompt", PROMPT, "--max-new-tokens", "8",
                 "--threads", "1", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_each_image_gets_its_own_count_as_in_mmtrt_run(dynamic_bundle, rng, tmp_path, capsys):
    counts = []
    for i in range(5):
        image = tmp_path / f"image{i}.png"
        random_image(rng, int(rng.integers(20, 120)), int(rng.integers(20, 120))).save(image)
        ours = generate_cpp(dynamic_bundle, image, PROMPT, "--max-new-tokens", "8")
        theirs = python_json(dynamic_bundle, image, capsys)
        for key in ("image_tokens", "prompt_tokens", "token_ids", "text"):
            assert ours[key] == theirs[key], (key, i)
        counts.append(ours["image_tokens"])
    assert len(set(counts)) > 1 and all(4 <= c <= 40 for c in counts)
