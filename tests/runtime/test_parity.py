"""The bundle decodes exactly what transformers' `generate` decodes, on the zoo model and on a saved checkpoint,
with the exporter's growing cache (hf), the static shared buffers and the paged block pool."""

import numpy as np
import pytest
import torch

from builders import random_image
from mmtrt.runtime import load

PROMPTS = ["What is in the picture?", "Describe the colours.", "How many objects are there, and where?"]
SIZES = [(90, 120), (64, 64), (200, 75)]
NEW_TOKENS = 12
# ONNX Runtime and PyTorch logits differ by about 1e-5; a step whose top-2 margin is below 100x that is a
# near tie that float error may legitimately flip, so tokens are compared up to the first such step.
NEAR_TIE = 1e-3


def reference(model, processor, image, prompt):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=image, text=text, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0].numpy()
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
    tokens = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    margins = [float(torch.topk(s[0], 2).values.diff().abs()) for s in out.scores]
    return inputs["input_ids"][0].tolist(), logits, tokens, margins


def prefill_logits(pipe, image, prompt):
    ids = np.array([pipe.prompt_ids(prompt)], np.int64)
    features = pipe.image_features(pipe.pixel_values(image))
    logits, _ = pipe.step(pipe.embed(ids, features), pipe.empty_cache())
    return ids[0].tolist(), logits[0]


@pytest.fixture(scope="module")
def siglip_model(siglip_checkpoint):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    return (LlavaForConditionalGeneration.from_pretrained(siglip_checkpoint).eval(),
            AutoProcessor.from_pretrained(siglip_checkpoint))


BUNDLES = {("tiny-llava", "hf"): "tiny_bundle", ("tiny-llava", "static"): "tiny_static_bundle",
           ("tiny-llava", "paged"): "tiny_paged_bundle",
           ("siglip-checkpoint", "hf"): "siglip_bundle", ("siglip-checkpoint", "static"): "siglip_static_bundle"}


@pytest.fixture(params=list(BUNDLES), ids=["-".join(k) for k in BUNDLES])
def case(request, tiny):
    model = tiny if request.param[0] == "tiny-llava" else request.getfixturevalue("siglip_model")
    return model, load(request.getfixturevalue(BUNDLES[request.param]))


def decided_steps(margins):
    """How many leading steps are decided: top-2 margin far above float error."""
    return next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(margins))


@pytest.mark.parametrize("index", range(3))
def test_greedy_tokens_and_prefill_logits_match_transformers(case, index, rng):
    (model, processor), pipe = case
    for _ in range(5):  # a random input whose first steps are near ties cannot tell right from wrong: draw again
        image = random_image(rng, *SIZES[index])
        ref_ids, ref_logits, ref_tokens, margins = reference(model, processor, image, PROMPTS[index])
        decided = decided_steps(margins)
        if decided >= NEW_TOKENS // 2:
            break
    assert decided >= NEW_TOKENS // 2, f"five random images all had early near ties: {margins}"
    ids, logits = prefill_logits(pipe, image, PROMPTS[index])
    assert ids == ref_ids
    assert np.abs(logits - ref_logits).max() <= 1e-3

    ours = pipe.generate(image, PROMPTS[index], max_new_tokens=NEW_TOKENS).token_ids
    assert ours[:decided] == ref_tokens[:decided]
    assert len(ours) == len(ref_tokens) or decided < len(margins)


def test_prompt_formatting_matches_the_processor(tiny, tiny_bundle):
    model, processor = tiny
    pipe = load(tiny_bundle)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    expected = processor(text=text, images=random_image(np.random.default_rng(0), 32, 32))["input_ids"][0]
    assert pipe.prompt_ids("hi") == list(expected)
