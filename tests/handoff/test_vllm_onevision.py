"""vLLM (its own environment, on the CPU) behind a tiny LLaVA-OneVision bundle: the any-resolution image's
features, packed by the bundle (tiles, base and newline rows, a count that varies with the image's size), go to
vLLM as image_embeds, and its greedy tokens are `mmtrt run`'s; vLLM alone, with its own preprocessing and vision
tower on the exported folder, counts the same image tokens."""

from __future__ import annotations

import pytest

from builders import random_image
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
def split(onevision_bundle, tmp_path_factory):
    folder = tmp_path_factory.mktemp("onevision-hf") / "hf"
    export_hf(onevision_bundle, folder)
    pipe = load_vllm(onevision_bundle, folder)
    yield pipe
    pipe.close()


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


def test_vllm_alone_expands_the_placeholder_to_the_bundles_image_tokens(onevision_bundle, split, rng):
    """vLLM's own any-resolution preprocessing of the exported folder's processor config lays out the image's
    tokens as the bundle does (the count is where the two would first disagree)."""
    import queue

    import numpy as np

    from mmtrt.handoff.vllm_scheduler import collapse_image_runs

    image = random_image(rng, 80, 52)
    expected = load(onevision_bundle, threads=1).generate(image, PROMPT, max_new_tokens=4)
    ids = collapse_image_runs(split.prompt_ids(PROMPT), split.model["image_token_id"])
    messages: queue.SimpleQueue = queue.SimpleQueue()
    greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, "repetition_penalty": 1.0}
    split.engine.submit(split.engine.new_id(), ids, None, greedy, 4, list(split.model["eos_token_ids"]),
                        messages.put, image=np.asarray(image))
    first = messages.get(timeout=120)
    assert first.get("finish_reason") != "error", first
    assert (first["prompt_tokens"], first["image_tokens"]) == (expected.prompt_tokens, expected.image_tokens)
    while not first["finish_reason"]:
        first = messages.get(timeout=120)
