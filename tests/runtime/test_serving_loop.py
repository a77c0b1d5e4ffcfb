"""The serving loop: concurrent mixed requests each get their solo tokens, joining mid-decode; a cancelled
request's KV blocks are free when cancel returns; a full queue refuses; drain finishes what it accepted."""

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from builders import assert_same_up_to_near_ties, random_image
from mmtrt.errors import UserError
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.runtime.sampling import SamplingParams
from mmtrt.runtime.serving_loop import QueueFull, ServingLoop, Unavailable

WORDS = ["red", "cat", "under", "the", "blue", "table", "near", "a", "window"]


@pytest.fixture(scope="module", params=["static", "paged", "hf"])
def served(request):
    name = "tiny_bundle" if request.param == "hf" else f"tiny_{request.param}_bundle"
    return request.param, load(request.getfixturevalue(name))


def mixed(rng, n):
    """Greedy and sampled (seeded, top-k/p, penalty), short and long, several on one image (a shared prefix)."""
    images = [random_image(rng, int(rng.integers(20, 100)), int(rng.integers(20, 100))) for _ in range(3)]
    out = []
    for i in range(n):
        sampling = SamplingParams(int(rng.integers(3, 21))) if i % 2 else SamplingParams(
            int(rng.integers(3, 21)), temperature=0.9, top_p=0.9, top_k=40, seed=int(rng.integers(2**32)),
            repetition_penalty=1.1)
        out.append(Request(images[i % 3], " ".join(rng.choice(WORDS, int(rng.integers(1, 20)))), sampling=sampling))
    return out


def used_blocks(pipe):
    allocator = pipe.stepper.cache.allocator
    return allocator.total - allocator.available


def test_concurrent_mixed_requests_each_get_their_solo_tokens(served, rng):
    layout, pipe = served
    requests = mixed(rng, 9)
    solo = [pipe.generate_batch([r])[0] for r in requests]
    for seed in range(50):  # a first request that runs to its limit: the others join while it decodes
        first_request = Request(requests[0].image, requests[0].prompt,
                                sampling=SamplingParams(20, temperature=0.5, seed=seed))
        if len((first_alone := pipe.generate_batch([first_request])[0]).token_ids) == 20:
            break
    late, seen, joined = [], [], threading.Event()

    def join_later(delta):  # on the loop's thread, at the first request's third token: the rest join mid-decode
        seen.append(delta)
        if len(seen) == 3:
            late.extend(loop.submit(r) for r in requests[5:])
            joined.set()

    with ServingLoop(pipe, max_queue=16) as loop:
        first = loop.submit(first_request, on_delta=join_later)
        with ThreadPoolExecutor(4) as pool:
            early = list(pool.map(loop.submit, requests[:5]))
        assert joined.wait(60)
        handles = early + late
        streamed = [list(h) for h in handles]
        first.result(60)
        assert loop.drain(60)
        metrics = loop.metrics()
    assert len(late) == 4 and len(seen) == len(first.result().token_ids)
    assert_same_up_to_near_ties(first.result(), first_alone)
    for handle, deltas, alone in zip(handles, streamed, solo):
        ours = handle.result()
        assert [t for d in deltas for t in d.token_ids] == ours.token_ids
        assert "".join(d.text for d in deltas) == ours.text and deltas[-1].finish_reason == ours.finish_reason
        assert_same_up_to_near_ties(ours, alone)
    assert metrics.requests_finished == 10 and metrics.queued == metrics.running == metrics.kv_blocks_used == 0
    assert metrics.tokens_generated == sum(len(h.result().token_ids) for h in handles + [first])
    assert metrics.time_to_first_token_s > 0 and metrics.tokens_per_s > 0
    if layout == "paged":
        assert used_blocks(pipe) == 0 and not pipe.stepper.cache.tables


def test_cancel_frees_the_requests_kv_blocks_when_it_returns(tiny_paged_bundle, rng):
    pipe = load(tiny_paged_bundle)
    cache = pipe.stepper.cache
    prompt = "tell me more " * 6
    for _ in range(5):  # an image whose answer runs to the limit: the request is still running when cancelled
        image = random_image(rng, 40, 40)
        if len(pipe.generate(image, prompt, 32).token_ids) == 32:
            break
    paused, resume, seen = threading.Event(), threading.Event(), []

    def pause_at_second(delta):  # holds the loop's thread after the request's second token
        seen.append(delta)
        if len(seen) == 2:
            paused.set()
            resume.wait(60)

    with ServingLoop(pipe) as loop:
        a = loop.submit(Request(image, prompt, 32), on_delta=pause_at_second)
        b = loop.submit(Request(random_image(rng, 50, 30), "and you?", 8))
        assert paused.wait(60)
        queued = loop.submit(Request(image, "never runs", 4))
        queued.cancel()  # still queued: it ends at once, having taken nothing
        assert queued.result(0).finish_reason == "abort" and queued.result().token_ids == [] and queued.seq is None
        mine = list(cache.tables[a.id])
        resume.set()
        a.cancel()
        assert a.id not in cache.tables and a.finish_reason == "abort" and seen[-1].finish_reason == "abort"
        owners = {block for table in list(cache.tables.values()) for block in table}
        assert all(cache.allocator.refs[block] == 0 or block in owners for block in mine)
        assert 2 <= len(a.result().token_ids) < 32
        assert b.result(60).finish_reason in ("stop", "length")
    assert used_blocks(pipe) == 0 and not cache.tables


@contextlib.contextmanager
def held_in_first_step(pipe, image, max_batch, max_queue):
    """A ServingLoop whose thread stays inside the request "first"'s first step until `release` is set, so what is
    submitted meanwhile waits in the queue: yields the loop, that request's handle and `release`; closes the loop."""
    release, blocked = threading.Event(), threading.Event()

    def hold(delta):
        blocked.set()
        release.wait(60)

    loop = ServingLoop(pipe, max_batch=max_batch, max_queue=max_queue)
    try:
        running = loop.submit(Request(image, "first", 4), on_delta=hold)
        assert blocked.wait(60)
        yield loop, running, release
    finally:
        release.set()
        loop.close()


def test_a_full_queue_refuses_and_drain_finishes_what_it_accepted(tiny_static_bundle, rng):
    pipe = load(tiny_static_bundle)
    image = random_image(rng, 40, 40)
    with held_in_first_step(pipe, image, max_batch=1, max_queue=2) as (loop, running, release):
        queued = [loop.submit(Request(image, f"next {i}", 4)) for i in range(2)]
        with pytest.raises(QueueFull, match="queue holds 2 requests"):
            loop.submit(Request(image, "one too many", 4))
        with pytest.raises(UserError, match="sampling: top_p"):
            loop.submit(Request(image, "bad", 4), SamplingParams(top_p=2.0))
        assert loop.metrics().queued == 2 and loop.metrics().requests_refused == 1
        assert not loop.drain(timeout=0)
        with pytest.raises(Unavailable, match="draining"):
            loop.submit(Request(image, "after drain", 4))
        release.set()
        assert loop.drain(60)
    assert all(h.result().finish_reason in ("stop", "length") for h in [running, *queued])
    assert loop.metrics().requests_refused == 2
    assert pipe.generate(image, "after the loop", 3).token_ids  # the pipeline is free again after close


def test_the_queue_holds_a_burst_that_fits_the_free_places_beyond_max_queue(tiny_static_bundle, rng):
    pipe = load(tiny_static_bundle)
    image = random_image(rng, 40, 40)
    with held_in_first_step(pipe, image, max_batch=3, max_queue=1) as (loop, running, release):
        burst = [loop.submit(Request(image, f"next {i}", 4)) for i in range(3)]  # 2 free places + 1 waiting
        with pytest.raises(QueueFull, match="queue holds 3 requests"):
            loop.submit(Request(image, "one too many", 4))
        assert loop.metrics().queued == 3 and loop.metrics().requests_refused == 1
        release.set()
        assert loop.drain(60)
    for handle, prompt in zip([running, *burst], ["first", "next 0", "next 1", "next 2"]):
        assert handle.result().token_ids == pipe.generate(image, prompt, 4).token_ids
