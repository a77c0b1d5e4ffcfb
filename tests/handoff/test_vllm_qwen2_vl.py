"""vLLM (its own environment, on the CPU) behind tiny Qwen2-VL and Qwen2.5-VL bundles: the bundle's image features go
to vLLM as image_embeds with the image's grid (image_grid_thw), from which vLLM sets the M-RoPE positions the
bundle's runtime sets; its greedy tokens are `mmtrt run`'s, one request or several of different grids decoded
together. vLLM alone on the exported folder (its own preprocessing and vision tower) gives the bundle's tokens too.
The tiny models' heads are 32 wide (hidden 128): vLLM's CPU attention has no kernel for 16. One vLLM engine at a
time, one per family."""

from __future__ import annotations

import numpy as np
import pytest

from builders import decided_steps, random_image
from conftest import compile_checkpoint
from mmtrt.handoff.vllm_process import VllmProcess
from mmtrt.handoff.vllm_scheduler import collapse_image_runs
from mmtrt.runtime import Request, load
from vllm_worker import require_vllm, split_pipeline

require_vllm()


PROMPT = "What is in the picture?"
SIZES = ((56, 84), (150, 60), (90, 90))  # (width, height): grids 4x6, 12x4 (patches), 6x6


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def family(request):
    return request.param


@pytest.fixture(scope="module", autouse=True)
def worker(family):
    """vLLM's process, started before the family's other fixtures: it imports vLLM while the bundle compiles."""
    process = VllmProcess()
    yield process
    process.close()


@pytest.fixture(scope="module")
def bundle(family, tmp_path_factory):
    from mmtrt.zoo.tiny_qwen2_vl import build_tiny_qwen2_vl

    folder = tmp_path_factory.mktemp(f"{family}-vllm")
    model, processor = build_tiny_qwen2_vl(family, hidden=128)
    return compile_checkpoint(folder, model, processor, f"{family}.bundle")


@pytest.fixture(scope="module")
def ours(bundle):
    return load(bundle, threads=1)


@pytest.fixture(scope="module")
def split(worker, bundle, tmp_path_factory):
    return split_pipeline(worker, bundle, tmp_path_factory.mktemp("qwen-hf") / "hf")


def greedy(engine, ids, image_inputs=None, image=None, tokens=12) -> list[int]:
    import queue

    messages: queue.SimpleQueue = queue.SimpleQueue()
    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, "repetition_penalty": 1.0}
    engine.submit(engine.new_id(), ids, image_inputs, sampling, tokens, [], messages.put, image)
    out = []
    while True:
        message = messages.get(timeout=120)
        out += message["tokens"]
        if message["finish_reason"]:
            assert message["finish_reason"] == "length", message
            return out


def test_images_of_different_grids_decoded_together_give_mmtrt_runs_tokens(ours, split, rng):
    images = [random_image(rng, h, w) for w, h in SIZES]
    expected = [ours.generate(image, PROMPT, max_new_tokens=12) for image in images]
    got = split.generate_batch([Request(image, PROMPT, 12) for image in images])
    for g, e in zip(got, expected):
        assert (g.token_ids, g.text) == (e.token_ids, e.text)
        assert (g.prompt_tokens, g.image_tokens) == (e.prompt_tokens, e.image_tokens)
    assert len({g.image_tokens for g in got}) == len(SIZES)  # vLLM expanded each placeholder to its own count
    assert set(split.runners) == {"vision"} and split.backends["llm"].startswith("vllm 0.32")


def test_the_grid_sets_the_positions(ours, split, rng):
    """Fed a random continuation (teacher forcing), vLLM ranks each of its tokens as the bundle's logits rank it;
    under the transposed grid (the same count, other M-RoPE positions) it does not: vLLM reads the positions from
    the grid the split hands it."""
    from mmtrt.eval.agreement import bundle_logits
    from mmtrt.eval.userdata import Sample

    image = random_image(rng, 60, 150)
    continuation = [int(t) for t in rng.integers(0, 256, 16)]
    logits = bundle_logits(ours, Sample(image, PROMPT), continuation)
    expected = [1 + int((row > row[t]).sum()) for row, t in zip(logits, continuation)]
    prep = split.prepare(0, Request(image, PROMPT, 1))
    ids = collapse_image_runs(prep.ids, split.model["image_token_id"]) + continuation
    t, h, w = prep.embeds["image_grid_thw"][0]
    assert h != w
    assert split.engine.prompt_ranks(ids, prep.embeds)[-16:] == expected
    transposed = {**prep.embeds, "image_grid_thw": np.array([[t, w, h]])}
    assert split.engine.prompt_ranks(ids, transposed)[-16:] != expected


def test_vllm_alone_on_the_exported_folder_gives_the_bundles_tokens(ours, split, rng):
    """vLLM's own preprocessing and vision tower (torch's kernels, not ONNX Runtime's): the same tokens up to the
    bundle's first near tie."""
    for width, height in SIZES[:2]:
        image = random_image(rng, height, width)
        expected = ours.generate(image, PROMPT, max_new_tokens=12)
        decided = decided_steps(expected.margins)
        ids = collapse_image_runs(ours.prompt_ids(PROMPT), ours.model["image_token_id"])
        assert greedy(split.engine, ids, image=np.asarray(image))[:decided] == expected.token_ids[:decided]
