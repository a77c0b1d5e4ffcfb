"""A request admitted beside running ones is prefilled in pieces, the running ones decoding a token between
pieces: on every KV layout each request keeps its solo greedy tokens, the running ones advance during the
admission, and under static a sequence that finishes between pieces hands its row to the one being admitted."""

import pytest

from builders import assert_admission_kept_solo_tokens, assert_same_up_to_near_ties, random_image, solo_generation
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.runtime.scheduler import Scheduler

PIECE = 16  # tokens: the tiny prompts (64 image tokens and their text) run in 5 to 9 pieces


@pytest.fixture(scope="module", params=["tiny_bundle", "tiny_static_bundle", "tiny_paged_bundle"])
def bundle(request):
    return request.getfixturevalue(request.param)


def test_running_sequences_decode_between_the_pieces_and_all_keep_their_solo_tokens(bundle, rng):
    pipe = load(bundle, prefix_cache_mib=0, encoder_cache_mib=0)
    pipe.prefill_chunk = PIECE
    running = Request(random_image(rng, 50, 70), "what is in it?", 24)
    admitted = Request(random_image(rng, 80, 40), "describe the shapes and their colours in detail " * 2, 12)
    scheduler = Scheduler(pipe)
    between = []
    try:
        (first, _), = scheduler.admit_together([pipe.prepare(0, running)])
        prep = pipe.prepare(1, admitted)
        (second, _), = scheduler.admit_together([prep], lambda: between.append(scheduler.step()))
        assert len(between) == -(-len(prep.ids) // PIECE) - 1  # a decode step after every piece but the last
        advanced = len(first.tokens)
        while scheduler.active:
            scheduler.step()
    finally:
        scheduler.close()
    assert_admission_kept_solo_tokens(pipe, bundle, (running, admitted), (first, second), advanced, len(between))


def test_a_sequence_finishing_between_the_pieces_leaves_the_admitted_one_its_solo_tokens(bundle, rng):
    """Under static the finished row is refilled from the last running one, and the admitted one moves in after
    it; its cache must come along whole."""
    pipe = load(bundle, prefix_cache_mib=0, encoder_cache_mib=0)
    pipe.prefill_chunk = PIECE
    requests = [Request(random_image(rng, 40, 40), "hi", 3), Request(random_image(rng, 60, 30), "and this?", 20),
                Request(random_image(rng, 70, 50), "count the objects, then name their colours " * 2, 10)]
    results = pipe.generate_batch(requests)  # the third is admitted while the first two run; the first ends
    for result, request in zip(results, requests):
        assert_same_up_to_near_ties(result, solo_generation(bundle, request))


def test_a_request_alone_is_prefilled_in_one_call(tiny_static_bundle, rng):
    pipe = load(tiny_static_bundle, prefix_cache_mib=0, encoder_cache_mib=0)
    pipe.prefill_chunk = PIECE
    calls = []
    run = pipe.stepper.run
    pipe.stepper.run = lambda *a, **k: calls.append(a[0].shape[1]) or run(*a, **k)
    pipe.generate(random_image(rng, 40, 40), "what is it?", 2)
    assert calls[0] > PIECE  # the prompt in one call: nothing runs beside it
