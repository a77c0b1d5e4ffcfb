"""vLLM (its own environment, on the CPU) behind a tiny LLaVA-OneVision bundle: the any-resolution image's
features, packed by the bundle (tiles, base and newline rows, a count that varies with the image's size), go to
vLLM as image_embeds, and its greedy tokens are `mmtrt run`'s. The tiny model's projector reads one vision layer,
as the 0.5B model's does; one reading two is refused in one line (vLLM's OneVision takes one)."""

from __future__ import annotations

import pytest

from builders import random_image
from conftest import compile_checkpoint
from mmtrt.handoff.hf_export import export_hf
from mmtrt.runtime import Request, load
from vllm_worker import require_vllm, split_pipeline, worker  # noqa: F401 (worker: the module's vLLM process)

require_vllm()


PROMPT = "What is in the picture?"


@pytest.fixture(scope="module")
def one_layer_bundle(tmp_path_factory):
    """A tiny LLaVA-OneVision whose projector reads the last vision layer only (hidden 128, heads of 32: vLLM's
    CPU attention has no kernel for 16), static KV layout."""
    from mmtrt.zoo.tiny_anyres import build_tiny_llava_onevision

    folder = tmp_path_factory.mktemp("onevision-one-layer")
    model, processor = build_tiny_llava_onevision(hidden=128, feature_layer=-1)
    return compile_checkpoint(folder, model, processor, "onevision.bundle",
                              "passes:\n  - kv_layout: {layout: static}\n")


@pytest.fixture(scope="module")
def split(worker, one_layer_bundle, tmp_path_factory):
    return split_pipeline(worker, one_layer_bundle, tmp_path_factory.mktemp("onevision-hf") / "hf")


def test_a_projector_of_two_vision_layers_is_refused_in_one_line(onevision_bundle, tmp_path, capsys):
    from mmtrt.cli import main

    export_hf(onevision_bundle, tmp_path / "hf")  # the session's tiny OneVision: vision_feature_layer [-2, -1]
    code = main(["serve", str(onevision_bundle), "--llm", "vllm", "--llm-folder", str(tmp_path / "hf"), "--no-triton",
                 "--port", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "2 vision layers" in err[0] and "--llm bundle" in err[0], err


def test_images_of_different_grids_decoded_together_give_mmtrt_runs_tokens(one_layer_bundle, split, rng):
    """Their counts differ, and vLLM takes the images' embeddings in one batch."""
    ours = load(one_layer_bundle, threads=1)
    images = [random_image(rng, height, width) for width, height in ((50, 70), (96, 40), (64, 64))]
    expected = [ours.generate(image, PROMPT, max_new_tokens=12) for image in images]
    got = split.generate_batch([Request(image, PROMPT, 12) for image in images])
    for g, e in zip(got, expected):
        assert g.token_ids == e.token_ids and g.text == e.text
        assert (g.prompt_tokens, g.image_tokens) == (e.prompt_tokens, e.image_tokens)
    assert len({g.image_tokens for g in got}) > 1  # the images' sizes gave different grids: vLLM took each count
    assert set(split.runners) == {"vision"}
