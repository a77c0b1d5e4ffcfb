"""vLLM (its own environment, on the CPU) behind a tiny LLaVA-OneVision bundle: the any-resolution image's
features, packed by the bundle (tiles, base and newline rows, a count that varies with the image's size), go to
vLLM as image_embeds, and its greedy tokens are `mmtrt run`'s. The tiny model's projector reads one vision layer,
as the 0.5B model's does; one reading two is refused in one line (vLLM's OneVision takes one)."""

from __future__ import annotations

import pytest

from builders import random_image
from conftest import compile_to
from mmtrt.errors import UserError
from mmtrt.handoff.hf_export import export_hf
from mmtrt.handoff.vllm_env import vllm_python
from mmtrt.handoff.vllm_pipeline import load as load_vllm
from mmtrt.runtime import load

try:
    vllm_python()
except UserError as exc:
    pytest.skip(f"no vLLM environment: {exc}", allow_module_level=True)

PROMPT = "What is in the picture?"


@pytest.fixture(scope="module")
def onevision_bundle(tmp_path_factory):
    """A tiny LLaVA-OneVision whose projector reads the last vision layer only (hidden 128, heads of 32: vLLM's
    CPU attention has no kernel for 16), static KV layout."""
    from mmtrt.zoo.tiny_anyres import build_tiny_llava_onevision

    folder = tmp_path_factory.mktemp("onevision-one-layer")
    model, processor = build_tiny_llava_onevision(hidden=128, feature_layer=-1)
    model.save_pretrained(folder / "checkpoint")
    processor.save_pretrained(folder / "checkpoint")
    return compile_to(folder, "model: {source: hf, path: checkpoint}\npasses:\n  - kv_layout: {layout: static}\n",
                      "onevision.bundle")


@pytest.fixture(scope="module")
def split(onevision_bundle, tmp_path_factory):
    folder = tmp_path_factory.mktemp("onevision-hf") / "hf"
    export_hf(onevision_bundle, folder)
    pipe = load_vllm(onevision_bundle, folder)
    yield pipe
    pipe.close()


def test_a_projector_of_two_vision_layers_is_refused_in_one_line(anyres_compile, tmp_path, capsys):
    from mmtrt.cli import main

    bundle = anyres_compile("llava_onevision", "", "onevision-two-layers.bundle")  # vision_feature_layer [-2, -1]
    export_hf(bundle, tmp_path / "hf")
    code = main(["serve", str(bundle), "--llm", "vllm", "--llm-folder", str(tmp_path / "hf"), "--no-triton",
                 "--port", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "2 vision layers" in err[0] and "--llm bundle" in err[0], err


def test_greedy_tokens_equal_mmtrt_run_on_images_of_different_sizes(onevision_bundle, split, rng):
    ours = load(onevision_bundle, threads=1)
    counts = set()
    for width, height in ((50, 70), (96, 40), (64, 64)):
        image = random_image(rng, width, height)
        expected = ours.generate(image, PROMPT, max_new_tokens=12)
        got = split.generate(image, PROMPT, max_new_tokens=12)
        assert got.token_ids == expected.token_ids and got.text == expected.text
        assert (got.prompt_tokens, got.image_tokens) == (expected.prompt_tokens, expected.image_tokens)
        counts.add(got.image_tokens)
    assert len(counts) > 1  # the images' sizes gave different grids: vLLM took each count as given
    assert set(split.runners) == {"vision"}
