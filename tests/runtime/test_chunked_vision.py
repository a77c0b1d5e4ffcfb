"""An any-resolution request admitted beside running ones is encoded a tile per vision call, the running ones
decoding a token between calls (as its prefill is chunked): its features equal one call's over all tiles, and
both requests keep their solo greedy tokens, on the hf (LLaVA-NeXT) and static (LLaVA-OneVision) layouts."""

import numpy as np
import pytest

from builders import assert_admission_kept_solo_tokens, random_image
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.runtime.scheduler import Scheduler


@pytest.fixture(scope="module", params=["next_bundle", "onevision_bundle"])
def bundle(request):
    return request.getfixturevalue(request.param)


def test_running_sequences_decode_between_the_tiles_and_all_keep_their_solo_tokens(bundle, rng):
    pipe = load(bundle, prefix_cache_mib=0, encoder_cache_mib=0)
    pipe.prefill_chunk = 10 ** 6  # one prefill call: the steps counted below are the encoder's
    running = Request(random_image(rng, 45, 45), "what is in it?", 16)
    admitted = Request(random_image(rng, 24, 230), "describe the colours", 8)
    scheduler = Scheduler(pipe)
    between = []
    try:
        (first, _), = scheduler.admit_together([pipe.prepare(0, running)])
        prep = pipe.check(1, admitted)
        tiles = len(prep.pixels[0])
        whole = pipe.image_features(prep.pixels[0], prep.sizes[0])
        pipe.embed_request(prep, between=lambda: between.append(scheduler.step()))
        assert tiles > 2 and len(between) == tiles - 1  # a decode step after every tile but the last
        image = np.array(prep.ids) == pipe.model["image_token_id"]
        np.testing.assert_allclose(prep.embeds[0, image], whole[0], rtol=0, atol=1e-5)
        (second, _), = scheduler.admit_together([prep])
        advanced = len(first.tokens)
        while scheduler.active:
            scheduler.step()
    finally:
        scheduler.close()
    assert_admission_kept_solo_tokens(pipe, bundle, (running, admitted), (first, second), advanced, len(between))
