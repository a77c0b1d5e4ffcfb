"""vLLM (its own environment, on the CPU) behind a tiny LLaVA-NeXT bundle: the any-resolution image's features,
packed by the bundle (base tile, grid tiles, newline rows: a count that varies with the image's shape), go to vLLM
as image_embeds, and its greedy tokens are `mmtrt run`'s; vLLM alone on the exported folder (its own tiling and
vision tower) gives them too. Heads of 32 (hidden 128): vLLM's CPU attention has no kernel for 16. One vLLM
engine for the module."""

from __future__ import annotations

import numpy as np
import pytest

from builders import decided_steps, random_image
from conftest import compile_checkpoint
from mmtrt.handoff.vllm_scheduler import collapse_image_runs
from mmtrt.runtime import Request, load
from vllm_worker import require_vllm, split_pipeline, worker  # noqa: F401 (worker: the module's vLLM process)

require_vllm()


PROMPT = "What is in the picture?"
SIZES = ((64, 30), (30, 64), (60, 60))  # (width, height): grids of 1x2, 2x1 and 2x2 tiles


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from mmtrt.zoo.tiny_anyres import build_tiny_llava_next

    folder = tmp_path_factory.mktemp("next-vllm")
    model, processor = build_tiny_llava_next(hidden=128)
    return compile_checkpoint(folder, model, processor, "next.bundle")


@pytest.fixture(scope="module")
def ours(bundle):
    return load(bundle, threads=1)


@pytest.fixture(scope="module")
def split(worker, bundle, tmp_path_factory):
    return split_pipeline(worker, bundle, tmp_path_factory.mktemp("next-hf") / "hf")


def test_images_of_different_grids_decoded_together_give_mmtrt_runs_tokens(ours, split, rng):
    images = [random_image(rng, h, w) for w, h in SIZES]
    expected = [ours.generate(image, PROMPT, max_new_tokens=12) for image in images]
    got = split.generate_batch([Request(image, PROMPT, 12) for image in images])
    for g, e in zip(got, expected):
        assert (g.token_ids, g.text) == (e.token_ids, e.text)
        assert (g.prompt_tokens, g.image_tokens) == (e.prompt_tokens, e.image_tokens)
    assert len({g.image_tokens for g in got}) == len(SIZES)  # vLLM took each image's own count
    assert set(split.runners) == {"vision"} and split.backends["llm"].startswith("vllm 0.32")


def test_vllm_alone_on_the_exported_folder_gives_the_bundles_tokens(ours, split, rng):
    """vLLM's own tiling, vision tower and packing (torch's kernels): the same tokens up to the bundle's first near
    tie."""
    import queue

    greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, "repetition_penalty": 1.0}
    ids = collapse_image_runs(ours.prompt_ids(PROMPT), ours.model["image_token_id"])
    for width, height in SIZES[:2]:
        image = random_image(rng, height, width)
        expected = ours.generate(image, PROMPT, max_new_tokens=12)
        messages: queue.SimpleQueue = queue.SimpleQueue()
        split.engine.submit(split.engine.new_id(), ids, None, greedy, 12, [], messages.put, np.asarray(image))
        got, image_tokens = [], None
        while not (message := messages.get(timeout=120))["finish_reason"]:
            got += message["tokens"]
            image_tokens = message.get("image_tokens", image_tokens)
        got += message["tokens"]
        assert image_tokens == expected.image_tokens  # vLLM's own tiling counts the bundle's tokens
        decided = decided_steps(expected.margins)
        assert got[:decided] == expected.token_ids[:decided]
