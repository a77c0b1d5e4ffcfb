"""LLaVA-NeXT and LLaVA-OneVision bundles decode what transformers' `generate` decodes, image by image (square,
very wide, very tall, the smallest, the largest), alone and in batches of mixed sizes, and refuse an
image whose grid the envelope does not take."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from builders import assert_same_up_to_near_ties, hf_greedy, hf_prefill_logits, random_image
from mmtrt.errors import UserError
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request

NEW_TOKENS = 8
# (height, width): square, very wide, very tall, the smallest, and the largest, which takes each tiny model's most
# image tokens (tests/backends/test_anyres.py searches them)
SIZES = {"llava_next": [(45, 45), (24, 230), (230, 24), (1, 1), (160, 160)],
         "llava_onevision": [(45, 45), (24, 230), (230, 24), (1, 1), (96, 55)]}
PROMPTS = ["What is in the picture?", "Describe the colours.", "Where is the light?"]


@pytest.fixture(scope="module", params=list(SIZES))
def case(request, anyres_checkpoints):
    import transformers

    family = request.param
    folder = anyres_checkpoints[family]
    model_class = {"llava_next": transformers.LlavaNextForConditionalGeneration,
                   "llava_onevision": transformers.LlavaOnevisionForConditionalGeneration}[family]
    source = model_class.from_pretrained(folder).eval(), transformers.AutoProcessor.from_pretrained(folder)
    bundle = request.getfixturevalue({"llava_next": "next_bundle", "llava_onevision": "onevision_bundle"}[family])
    return family, source, load(bundle)


def test_tokens_prompt_and_prefill_logits_equal_transformers(case, rng):
    family, (model, processor), pipe = case
    for index, (height, width) in enumerate(SIZES[family]):
        image, prompt = random_image(rng, height, width), PROMPTS[index % len(PROMPTS)]
        ref_ids, ref_tokens, margins = hf_greedy(model, processor, image, prompt, NEW_TOKENS)
        ref_logits = hf_prefill_logits(model, processor, image, prompt)
        ids, features = pipe.encode_image(image, pipe.prompt_ids(prompt))
        assert ids == ref_ids, (height, width)
        logits, _ = pipe.step(pipe.embed(np.array([ids], np.int64), features), pipe.empty_cache())
        assert np.abs(logits[0] - ref_logits).max() <= 1e-3, (height, width)
        ours = pipe.generate(image, prompt, max_new_tokens=NEW_TOKENS)
        assert ours.image_tokens == ref_ids.count(processor.image_token_id)
        assert_same_up_to_near_ties(ours, SimpleNamespace(token_ids=ref_tokens, margins=margins))


def test_a_batch_of_images_of_different_sizes_gets_each_ones_tokens(case, rng):
    _, _, pipe = case
    requests = [Request(random_image(rng, int(rng.integers(1, 300)), int(rng.integers(1, 300))),
                        PROMPTS[i % len(PROMPTS)], int(rng.integers(2, NEW_TOKENS + 1))) for i in range(5)]
    batch = pipe.generate_batch(requests)
    assert len({g.image_tokens for g in batch}) > 1
    for request, ours in zip(requests, batch):
        assert_same_up_to_near_ties(ours, pipe.generate_batch([request])[0])


def test_an_image_needing_more_tiles_than_the_envelope_is_refused_in_one_line(anyres_compile, rng):
    bundle = anyres_compile("llava_next", "envelope: {image: {max_tiles: 2}}\n", "next-two-tiles.bundle")
    pipe = load(bundle)
    assert pipe.model["vision"]["image_tokens"] < 88 and pipe.dims["num_images"]["max"] == 3
    assert pipe.generate(random_image(rng, 32, 64), "hi", max_new_tokens=2).image_tokens == 16 + 4 * (8 + 1)
    with pytest.raises(UserError) as info:
        pipe.generate(random_image(rng, 70, 70), "hi", max_new_tokens=2)
    message = str(info.value)
    assert "\n" not in message and "2x2 tiles" in message and "envelope.image.max_tiles" in message


def test_the_new_towers_are_one_tensorrt_segment_and_a_plain_recipe_writes_no_tensorrt_llm_checkpoint(
        next_bundle, onevision_bundle):
    """The Qwen2 LLM's TensorRT-LLM checkpoint, when a recipe opts in, is checked in tests/passes/test_anyres_passes.py."""
    for bundle in (next_bundle, onevision_bundle):
        manifest = load(bundle).manifest
        assert [s["backend"] for s in manifest["placement"]["vision"]["segments"]] == ["tensorrt"]
        assert all(n["backend"] == "tensorrt" for n in manifest["placement"]["vision"]["nodes"])
        assert manifest["tensorrt_llm"] is None and not (bundle / "trtllm").exists()
