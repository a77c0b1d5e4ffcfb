"""An image's KV prefix is computed once and reused on every KV layout: later questions on it, and the same request
again, get the tokens of a fresh run."""

import numpy as np
import pytest

from builders import random_image
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.runtime.prefix import PrefixCache, prefix_length

QUESTIONS = ["What is it?", "Describe the colours in detail, from left to right.", "Where?"]


@pytest.fixture(scope="module", params=["hf", "static", "paged"])
def bundle(request):
    return request.getfixturevalue("tiny_bundle" if request.param == "hf" else f"tiny_{request.param}_bundle")


def test_later_questions_on_an_image_equal_fresh_runs(bundle, rng):
    pipe, fresh = load(bundle), load(bundle, prefix_cache_mib=0)
    image, other = random_image(rng, 70, 90), random_image(rng, 70, 90)
    ours = [pipe.generate(image, q, 12) for q in QUESTIONS] + [pipe.generate(other, QUESTIONS[0], 12)]
    ref = [fresh.generate(image, q, 12) for q in QUESTIONS] + [fresh.generate(other, QUESTIONS[0], 12)]
    assert [g.token_ids for g in ours] == [g.token_ids for g in ref]
    assert (pipe.prefixes.hits, pipe.prefixes.misses) == (2, 2)  # other pixels are another prefix
    assert fresh.prefixes.hits == 0 and not fresh.prefixes.entries


def test_a_batch_of_questions_on_one_image_reuses_it_within_the_batch(bundle, rng):
    pipe, fresh = load(bundle), load(bundle, prefix_cache_mib=0)
    image = random_image(rng, 64, 64)
    batch = pipe.generate_batch([Request(image, q, 10) for q in QUESTIONS])
    assert [g.token_ids for g in batch] == [fresh.generate(image, q, 10).token_ids for q in QUESTIONS]
    assert len(pipe.prefixes.entries) == 1 + len(QUESTIONS)  # the image's prefix, each prompt but its last token


def test_the_same_request_again_prefills_its_last_token_only(bundle, rng):
    pipe, fresh = load(bundle), load(bundle, prefix_cache_mib=0)
    image, question = random_image(rng, 70, 90), QUESTIONS[int(rng.integers(len(QUESTIONS)))]
    prefilled, embed_request = [], pipe.embed_request
    pipe.embed_request = lambda prep, *args: (prefilled.append(embed_request(prep, *args).embeds.shape[1]), prep)[1]
    first = pipe.generate(image, question, 12)
    again = pipe.generate(image, question, 12)
    other = pipe.generate(image, QUESTIONS[0] + " " + question, 12)  # the image prefix only
    assert [first.token_ids, again.token_ids, other.token_ids] == [
        fresh.generate(image, q, 12).token_ids for q in (question, question, QUESTIONS[0] + " " + question)]
    image_prefix = prefix_length(pipe.prompt_ids(question), pipe.model["image_token_id"])
    assert prefilled == [first.prompt_tokens, 1, other.prompt_tokens - image_prefix]


def test_the_prefix_ends_at_the_last_image_token():
    assert prefix_length([1, 2, 9, 9, 9, 5, 6], image_token_id=9) == 5
    assert prefix_length([1, 9, 9], image_token_id=9) == 0  # nothing after the image: nothing to reuse


def test_the_lru_stays_within_its_bound_and_evicts_the_least_recent():
    cache = PrefixCache(mib=1)
    block = [np.zeros(2**17, np.float32)]  # 0.5 MiB
    cache.put("a", block)
    cache.put("b", list(block))
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", list(block))
    assert set(cache.entries) == {"a", "c"} and cache.nbytes <= 2**20
    cache.put("huge", [np.zeros(2**19, np.float32)])  # 2 MiB never fits
    assert "huge" not in cache.entries and set(cache.entries) == {"a", "c"}


def test_paged_requests_of_a_batch_share_the_image_prefix_blocks(tiny_paged_bundle, rng):
    pipe, fresh = load(tiny_paged_bundle, prefix_cache_mib=0), load(tiny_paged_bundle, prefix_cache_mib=0)
    cache = pipe.stepper.cache
    shared = []
    share = cache.allocator.share
    cache.allocator.share = lambda block: (shared.append(block), share(block))[1]
    encoded, encode = [], pipe.image_features
    pipe.image_features = lambda pixels, size=None, between=None: (encoded.append(pixels.shape),
                                                                   encode(pixels, size, between))[1]
    image, other = random_image(rng, 64, 64), random_image(rng, 50, 80)
    requests = [Request(image, q, 10) for q in QUESTIONS] + [Request(other, QUESTIONS[0], 10)]
    batch = pipe.generate_batch(requests)
    assert [g.token_ids for g in batch] == [fresh.generate(r.image, r.prompt, 10).token_ids for r in requests]
    ids = pipe.prompt_ids(QUESTIONS[0])
    full_blocks = prefix_length(ids, pipe.model["image_token_id"]) // cache.block_tokens
    assert full_blocks >= 2 and len(shared) == 2 * full_blocks  # the 2nd and 3rd question fork the 1st, not `other`
    assert len(set(shared)) == full_blocks and not pipe.prefixes.entries
    assert len(encoded) == 2  # the vision encoder ran once per distinct image of the batch
    assert cache.allocator.available == cache.allocator.total and not any(cache.allocator.refs)
