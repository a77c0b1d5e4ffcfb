"""Hypothesis against one real `mmtrt serve` (the tiny model, paged KV layout, an allow-list with a FIFO, a folder
and links in and out): chat bodies of hostile shapes and values, typed special tokens, image bytes that are
mutated, truncated, huge or not images at all, and image names that leave the allow-list. Every answer is a 4xx
in OpenAI's error shape on one line, or 200 with the tokens the runtime gives the same request alone; meanwhile
/health and a reference request from another client answer within a bound; at the end no KV block is held."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostile
from builders import random_image
from mmtrt.runtime import load
from mmtrt.serve.limits import Limits
from mmtrt.serve.protocol import prepare
from servers import Server

MODEL = "paged"
LIMITS = Limits(max_body_bytes=2_000_000, max_text_chars=4000, max_image_pixels=600_000)
HEALTH_BOUND_S, REFERENCE_BOUND_S = 5.0, 60.0
FUZZ = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

SPECIAL = ["<|im_end|>", "<|im_start|>", "<image>", "<pad>", "\0", "\ue000", "\ue0000\ue001", "\n", "{{ x }}"]
texts = st.text(max_size=30) | st.lists(st.sampled_from(SPECIAL) | st.text(max_size=4), max_size=6).map("".join)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True), texts)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
                      max_leaves=6)


def _png(seed: int) -> bytes:
    return hostile.png(hostile.noise(np.random.default_rng(seed), 24, 32))


def _mutated(seed: int, flips: int, cut: int) -> bytes:
    raw, rng = bytearray(_png(seed)), np.random.default_rng(seed)
    for at in rng.integers(8, len(raw), flips):
        raw[at] ^= int(rng.integers(1, 256))
    return bytes(raw[:len(raw) - cut])


image_bytes = st.one_of(
    st.binary(max_size=64),
    st.builds(_png, st.integers(0, 9)),
    st.builds(_mutated, st.integers(0, 9), st.integers(1, 6), st.integers(0, 300)),
    st.sampled_from(sorted(hostile.BAD_IMAGES)).map(lambda k: hostile.BAD_IMAGES[k](np.random.default_rng(0))),
    st.builds(hostile.large_png, st.integers(1, 1500), st.integers(1, 1500)),
)
names = st.sampled_from(["pipe.png", "sub", "sub/", "sub/cat.png", "./sub/cat.png", "../outside/secret.png",
                         "out.png", "/etc/passwd", "/dev/zero", "sub/cat.png\0x", "http://127.0.0.1:1/x.png",
                         "file:///etc/passwd", "data:image/png;base64,@@", "data:,x", ""]) | texts
urls = image_bytes.map(hostile.data_uri) | names
parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": urls})}),
    st.fixed_dictionaries({"type": st.just("image"), "image": urls}),
    st.dictionaries(st.sampled_from(["type", "text", "image", "image_url"]), values, max_size=3))
messages = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "robot"]),
                                  "content": texts | st.lists(parts, max_size=5)}) | values
bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL) | values, "messages": st.lists(messages, min_size=1, max_size=3) | values,
     "max_tokens": st.integers(1, 4) | values},
    optional={"temperature": st.floats(allow_nan=True) | values, "top_k": st.integers(-3, 60) | values,
              "top_p": st.floats(-1, 2) | values, "seed": st.integers(-5, 2**66) | values,
              "stop": texts | st.lists(texts, max_size=2) | values, "stream": st.booleans() | values,
              "stream_options": values, "n": st.integers(0, 3) | values, "logprobs": values})
raw_bodies = st.one_of(
    bodies.map(lambda b: json.dumps(b).encode()),
    bodies.map(lambda b: json.dumps(b).encode()).flatmap(lambda r: st.integers(0, len(r)).map(lambda n: r[:n])),
    st.integers(1, 30_000).map(hostile.deep_json),
    st.integers(4000, 6000).map(lambda d: hostile.huge_int_json(MODEL, d)),
    st.binary(max_size=100))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    allowed, outside = root / "allowed", root / "outside"
    (allowed / "sub").mkdir(parents=True)
    outside.mkdir()
    random_image(np.random.default_rng(1), 40, 56).save(allowed / "sub" / "cat.png")
    random_image(np.random.default_rng(2), 40, 56).save(outside / "secret.png")
    (allowed / "out.png").symlink_to(outside / "secret.png")
    os.mkfifo(allowed / "pipe.png")
    return allowed


@pytest.fixture(scope="module")
def server(tiny_paged_bundle, tree):
    s = Server(tiny_paged_bundle, "--max-batch", "2", "--allow-images", str(tree), "--max-body-bytes",
               str(LIMITS.max_body_bytes), "--max-text-chars", str(LIMITS.max_text_chars), "--max-image-pixels",
               str(LIMITS.max_image_pixels), triton=False)
    yield s
    s.close()


def post(url: str, raw: bytes, timeout: float = 120) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url + "/chat/completions", raw, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def streamed_tokens(body: bytes) -> list[int]:
    events = [json.loads(line[6:]) for line in body.decode().splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert all("error" not in e for e in events), events
    return [t for e in events for c in e["choices"] for t in c["token_ids"]]


class Watch:
    """Another client meanwhile: /health and a reference request in turn, each one's time, until stopped."""

    def __init__(self, url: str, reference: bytes, expected: list[int]):
        self.url, self.reference, self.expected = url, reference, expected
        self.health_s, self.reference_s, self.wrong = [], [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            urllib.request.urlopen(self.url.removesuffix("/v1") + "/health", timeout=60).read()
            self.health_s.append(time.monotonic() - t0)
            t0 = time.monotonic()
            status, _, answer = post(self.url, self.reference)
            self.reference_s.append(time.monotonic() - t0)
            if status != 200 or json.loads(answer)["choices"][0]["token_ids"] != self.expected:
                self.wrong.append((status, answer[:200]))
            self.stop.wait(0.2)


def reference_tokens(pipe, images, raw: bytes) -> list[int] | None:
    """The runtime's tokens for the same request alone, where they are determined (greedy or seeded)."""
    call = prepare(pipe, MODEL, raw, images, LIMITS)
    sampling = call.request.sampling
    if sampling is not None and not sampling.greedy and sampling.seed is None:
        return None
    return pipe.generate_batch([call.request])[0].token_ids


def test_hostile_requests_get_a_4xx_or_the_right_answer_and_stall_no_one(server, tree, tiny_paged_bundle):
    pipe = load(tiny_paged_bundle)
    images = LIMITS.images(tree)
    reference = json.dumps(hostile.with_images(MODEL, ["sub/cat.png"], "What is it?", 4)).encode()
    watch = Watch(server.url, reference, reference_tokens(pipe, images, reference))
    seen: dict[int, int] = {}

    @FUZZ
    @given(raw_bodies)
    def one(raw: bytes) -> None:
        status, kind, answer = post(server.url, raw)
        seen[status] = seen.get(status, 0) + 1
        if status != 200:
            error = json.loads(answer)["error"]
            assert 400 <= status < 500 and set(error) == {"message", "type", "param", "code"}, (status, answer)
            assert "\n" not in error["message"] and "Traceback" not in error["message"]
            return
        tokens = streamed_tokens(answer) if kind.startswith("text/event-stream") else \
            json.loads(answer)["choices"][0]["token_ids"]
        expected = reference_tokens(pipe, images, raw)
        assert expected is None or tokens == expected, (raw[:300], tokens, expected)

    try:
        one()
    finally:
        watch.stop.set()
        watch.thread.join(REFERENCE_BOUND_S)
    assert not watch.wrong, watch.wrong
    assert max(watch.health_s) < HEALTH_BOUND_S and max(watch.reference_s) < REFERENCE_BOUND_S, watch.__dict__
    assert sum(seen.values()) >= 30 and 200 in seen, seen
    m = server.wait_idle()
    assert m["mmtrt_kv_blocks_used"] == 0 and m["mmtrt_running_requests"] == 0, m
