"""Admissions prefilled together (paged layout): mixed lengths, text-only beside images, joining mid-decode, an
image prefix forked from a live holder or loaded from the prefix cache; each request gets its solo greedy tokens."""

import threading

import pytest

from builders import assert_same_up_to_near_ties, random_image
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.runtime.scheduler import Scheduler
from mmtrt.runtime.serving_loop import ServingLoop


@pytest.fixture(scope="module")
def solo(tiny_paged_bundle):
    """The reference: each request alone, no prefix kept."""
    pipe = load(tiny_paged_bundle, prefix_cache_mib=0, encoder_cache_mib=0)
    return lambda request: pipe.generate_batch([request])[0]


def test_prefills_together_give_each_request_its_solo_tokens(tiny_paged_bundle, solo, rng):
    pipe = load(tiny_paged_bundle)
    for _ in range(5):  # images whose requests run past the two steps below (a random one may end at once)
        images = [random_image(rng, int(rng.integers(24, 90)), int(rng.integers(24, 90))) for _ in range(3)]
        if all(len(solo(Request(images[i], q, 16)).token_ids) > 3 for i, q in ((0, "what is on the left side of it?"),
                                                                              (1, "colour?"))):
            break
    stored = Request(images[2], "first look", 4)
    pipe.generate_batch([stored])  # images[2]'s prefix is kept in the prefix cache
    first = [Request(images[0], "what is on the left side of it?", 12),
             Request(None, "a text-only question that runs much longer than the others do, " * 3, 3),  # leaves
             Request(images[1], "colour?", 16)]
    joining = [Request(images[0], "and what is on its right side, and below?", 9),  # forks the first's prefix
               Request(images[2], "now describe it", 12)]  # loads the stored prefix
    hits = pipe.prefixes.hits
    scheduler = Scheduler(pipe)
    try:
        preps = [pipe.prepare(i, r) for i, r in enumerate(first)]
        assert len({len(p.ids) for p in preps}) == 3
        events = scheduler.admit_together(preps)
        sequences = [seq for seq, _ in events]
        for _ in range(2):
            scheduler.step()
        later = [pipe.prepare(len(first) + i, r) for i, r in enumerate(joining)]
        assert len(scheduler.active) == 2  # the text-only one is done: two places are free (the batch holds 4)
        assert all(scheduler.joins(p, tuple(later[:i])) and scheduler.fits(p, tuple(later[:i]))
                   for i, p in enumerate(later))
        sequences += [seq for seq, _ in scheduler.admit_together(later)]
        tables = pipe.stepper.cache.tables
        assert tables[later[0].index][0] == tables[preps[0].index][0]  # the image prefix's first block is shared
        assert pipe.prefixes.hits == hits + 2  # both found at prepare; the first forks the live holder instead
        while scheduler.active:
            scheduler.step()
    finally:
        scheduler.close()
    for seq, request in zip(sequences, first + joining):
        assert_same_up_to_near_ties(pipe.generation(seq), solo(request))
    assert not pipe.stepper.cache.tables and pipe.stepper.cache.allocator.available == pipe.stepper.cache.allocator.total


def test_a_fresh_prefix_is_not_prefilled_twice_in_one_call(tiny_paged_bundle, rng):
    pipe = load(tiny_paged_bundle)
    image = random_image(rng, 40, 40)
    a, b = (pipe.prepare(i, Request(image, q, 4)) for i, q in enumerate(["one?", "two?"]))
    scheduler = Scheduler(pipe)
    try:
        assert a.prefix_key == b.prefix_key and not scheduler.joins(b, (a,)) and scheduler.joins(b, ())
    finally:
        scheduler.close()


def test_the_serving_loop_admits_waiting_requests_in_one_call_or_alone(tiny_paged_bundle, solo, rng):
    pipe = load(tiny_paged_bundle)
    image = random_image(rng, 50, 40)
    requests = [Request(random_image(rng, 30 + 9 * i, 60), " ".join(["why"] * (1 + 5 * i)), 6) for i in range(3)]
    for batched in (True, False):
        release, held = threading.Event(), threading.Event()

        def hold(delta):
            held.set()
            release.wait(60)

        with ServingLoop(pipe, batch_admissions=batched) as loop:
            first = loop.submit(Request(image, "hold on", 8), on_delta=hold)
            assert held.wait(60)
            waiting = [loop.submit(r) for r in requests]  # queued while the loop is held: admitted together
            release.set()
            results = [h.result(60) for h in waiting]
            first.result(60)
        spent = {r.timings["prefill_ms"] for r in results}
        assert len(spent) == (1 if batched else 3)  # one call's time shared, or a call each
        for ours, request in zip(results, requests):
            assert_same_up_to_near_ties(ours, solo(request))


def test_mrope_prompts_of_three_image_sizes_prefilled_together_give_their_solo_tokens(qwen_compile, rng):
    """Qwen2-VL under paged: each row's three rows of positions and its rope delta survive the left padding."""
    bundle = qwen_compile("qwen2_vl", "passes:\n  - kv_layout: {layout: paged, block_tokens: 4}\n",
                          "qwen2_vl-paged.bundle")
    pipe, reference = load(bundle, threads=1), load(bundle, threads=1, prefix_cache_mib=0, encoder_cache_mib=0)
    requests = [Request(random_image(rng, h, w), prompt, 6) for h, w, prompt in
                [(64, 64, "What is in the picture?"), (112, 140, "Describe it."), (40, 160, "A colour?")]]
    scheduler = Scheduler(pipe)
    try:
        preps = [pipe.embed_request(pipe.check(i, r)) for i, r in enumerate(requests)]
        assert len({len(p.ids) for p in preps}) == 3 and len({p.rope_delta for p in preps}) > 1
        sequences = [seq for seq, _ in scheduler.admit_together(preps)]
        while scheduler.active:
            scheduler.step()
    finally:
        scheduler.close()
    for seq, request in zip(sequences, requests):
        assert_same_up_to_near_ties(pipe.generation(seq), reference.generate_batch([request])[0])
