"""generate_batch: every request gets the tokens it gets alone; a refused request leaves the others running."""

import json

import numpy as np
import pytest

from builders import assert_same_up_to_near_ties, random_image
from mmtrt.cli import main
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.runtime.pipeline import Refused



@pytest.fixture(scope="module", params=["static", "paged"])
def kv_pipe(request):
    return load(request.getfixturevalue(f"tiny_{request.param}_bundle"))


def mixed_requests(rng, n):
    """Prompt lengths from 1 to many words, token limits from 2 to 32, images of different sizes."""
    words = ["red", "cat", "under", "the", "blue", "table", "near", "a", "window"]
    return [Request(random_image(rng, int(rng.integers(20, 120)), int(rng.integers(20, 120))),
                    " ".join(rng.choice(words, int(rng.integers(1, 40)))), int(rng.integers(2, 33)))
            for _ in range(n)]


def test_each_request_of_a_mixed_batch_gets_its_solo_tokens(kv_pipe, tiny_bundle, rng):
    requests = mixed_requests(rng, 7)  # more than the envelope's batch of 4: rows are reused as sequences finish
    batch = kv_pipe.generate_batch(requests)
    hf = load(tiny_bundle)
    assert len({len(g.token_ids) for g in batch}) > 1
    for request, ours in zip(requests, batch):
        assert_same_up_to_near_ties(ours, kv_pipe.generate_batch([request])[0])
        assert_same_up_to_near_ties(ours, hf.generate_batch([request])[0])
        assert set(ours.timings) == {"preprocess_ms", "vision_ms", "prefill_ms", "decode_ms_per_token"}


def test_a_request_outside_the_envelope_is_refused_alone(kv_pipe, rng):
    good = mixed_requests(rng, 2)
    too_long = Request(random_image(rng, 32, 32), "word " * 400, 4)
    too_many = Request(random_image(rng, 32, 32), "hi", 33)
    results = kv_pipe.generate_batch([good[0], too_long, too_many, good[1]])
    assert isinstance(results[1], Refused) and "accepts at most 256" in results[1].reason
    assert isinstance(results[2], Refused) and "outside 1..32" in results[2].reason
    assert results[2].to_json()["error"].startswith("request 3: ")
    for index in (0, 3):
        assert results[index].token_ids == kv_pipe.generate_batch([good[index // 3]])[0].token_ids


def test_the_cache_buffers_are_allocated_once_and_written_in_place(tiny_static_bundle, rng):
    kv_pipe = load(tiny_static_bundle)
    cache = kv_pipe.stepper.cache
    arrays = dict(cache.host)
    pointers = dict(cache.ptrs)
    kv_pipe.generate_batch(mixed_requests(rng, 3))
    assert all(cache.host[n] is arrays[n] for n in arrays) and cache.ptrs == pointers
    assert cache.host["past.0.key"][0, :, : int(cache.lengths[0])].any()
    assert cache.nbytes == sum(a.nbytes for a in arrays.values())


def test_run_requests_prints_one_result_per_line_in_input_order(tiny_static_bundle, tmp_path, rng, capsys):
    images = []
    for i, size in enumerate(((40, 50), (70, 30))):
        random_image(rng, *size).save(tmp_path / f"{i}.png")
        images.append(str(tmp_path / f"{i}.png"))
    lines = [json.dumps({"image": images[0], "prompt": "What is it?", "max_new_tokens": 5}), "{not json",
             json.dumps({"image": images[1], "prompt": "Colours?", "max_new_tokens": 99}),
             json.dumps({"image": images[1], "prompt": "Colours?"})]
    (tmp_path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    code = main(["run", str(tiny_static_bundle), "--requests", str(tmp_path / "requests.jsonl"), "--json"])
    out, err = capsys.readouterr()
    results = [json.loads(line) for line in out.splitlines()]
    assert code == 2 and len(results) == 4
    assert results[1]["error"].startswith("request 2: line 2 is not JSON")
    assert "outside 1..32" in results[2]["error"]
    assert err.count("mmtrt: error: request") == 2
    pipe = load(tiny_static_bundle)
    assert results[0]["token_ids"] == pipe.generate(images[0], "What is it?", 5).token_ids
    assert results[3]["token_ids"] == pipe.generate(images[1], "Colours?").token_ids
    assert {"text", "token_ids", "timings"} <= results[3].keys()
