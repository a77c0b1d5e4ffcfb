"""The encoder-output cache: an image's features by its content, across requests and chat templates, never another
image's (same file name, same size, same first bytes), within its byte bound; hits in the serving loop's metrics."""

import numpy as np
import pytest
from PIL import Image

from builders import random_image
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.runtime.serving_loop import ServingLoop
from mmtrt.serve.metrics import prometheus_text


@pytest.fixture(scope="module")
def uncached(tiny_bundle):
    return load(tiny_bundle, encoder_cache_mib=0)


def look_alike(rng, height=64, width=48) -> tuple[Image.Image, Image.Image]:
    """Two images of one size whose top halves are equal (stored PNGs of them share their first bytes)."""
    a = np.asarray(random_image(rng, height, width))
    b = a.copy()
    b[height // 2:] = np.asarray(random_image(rng, height - height // 2, width))
    return Image.fromarray(a), Image.fromarray(b)


def assert_as_uncached(cached, uncached, image, prompt: str) -> None:
    ours, ref = cached.prepare(0, Request(image, prompt)), uncached.prepare(0, Request(image, prompt))
    assert np.array_equal(ours.embeds, ref.embeds)
    assert cached.generate(image, prompt, 8).token_ids == uncached.generate(image, prompt, 8).token_ids


def test_an_image_never_gets_the_features_of_one_with_its_name_size_or_first_bytes(tiny_bundle, uncached, rng,
                                                                                   tmp_path):
    cached = load(tiny_bundle)
    a, b = look_alike(rng)
    path = tmp_path / "photo.png"
    a.save(path, compress_level=0)
    first = path.read_bytes()
    assert_as_uncached(cached, uncached, path, "what is this?")
    b.save(path, compress_level=0)  # the same file name, size and first half of the file's bytes
    shared = next(i for i, (x, y) in enumerate(zip(first, path.read_bytes())) if x != y)
    assert shared > len(first) // 3 and len(first) == path.stat().st_size
    misses = cached.encoder_cache.misses
    assert_as_uncached(cached, uncached, path, "what is this?")
    assert cached.encoder_cache.misses > misses and len(cached.encoder_cache.entries) == 2
    features = list(cached.encoder_cache.entries.values())
    assert not np.allclose(features[0], features[1])  # the two images' features differ: a mix-up would show


def test_a_repeated_image_is_a_hit_across_requests_and_chat_templates(tiny_bundle, uncached, rng):
    cached = load(tiny_bundle)
    image = random_image(rng, 40, 56)
    assert_as_uncached(cached, uncached, image, "describe it")
    hits = cached.encoder_cache.hits
    raw = "<image>\nUSER: name the colours ASSISTANT:"
    ours = cached.generate_batch([Request(image.copy(), raw, 6, raw_prompt=True)])[0]
    assert cached.encoder_cache.hits == hits + 1  # another PIL object, another template: the same content
    assert ours.token_ids == uncached.generate_batch([Request(image, raw, 6, raw_prompt=True)])[0].token_ids


def test_the_cache_keeps_within_its_bytes_evicting_the_least_recently_used(tiny_bundle, uncached, rng):
    images = [random_image(rng, 30 + 7 * i, 50) for i in range(4)]
    size = uncached.image_features(uncached.pixel_values(images[0])).nbytes
    # room for two images' features; no prefix cache, which would serve a repeated image's prefix first
    cached = load(tiny_bundle, encoder_cache_mib=2.5 * size / 2**20, prefix_cache_mib=0)
    cache = cached.encoder_cache
    for image in images[:3]:
        assert_as_uncached(cached, uncached, image, "and this one?")
        assert cache.nbytes <= cache.limit and len(cache.entries) <= 2
    assert len(cache.entries) == 2 and cache.nbytes == 2 * size
    misses = cache.misses
    cached.prepare(0, Request(images[0], "again"))  # evicted: the encoder runs again
    assert cache.misses == misses + 1
    hits = cache.hits
    cached.prepare(0, Request(images[0], "once more"))
    assert cache.hits == hits + 1 and cache.nbytes <= cache.limit


def test_the_serving_loop_reports_hits_beside_the_prefix_cache(tiny_paged_bundle, rng):
    pipe, reference = load(tiny_paged_bundle), load(tiny_paged_bundle, encoder_cache_mib=0, prefix_cache_mib=0)
    image = random_image(rng, 48, 48)
    # the second asks with another template text before the image (no stored prefix): the encoder cache serves
    # it; the third repeats the first's prefix: the prefix cache serves it and the encoder is not asked
    requests = [Request(image, "what is it?", 6), Request(image, "<image>\nUSER: and?\nASSISTANT:", 6,
                                                               raw_prompt=True), Request(image, "where is it?", 6)]
    with ServingLoop(pipe) as loop:
        results = [loop.submit(r).result(60) for r in requests]
        metrics = loop.metrics()
    assert (metrics.encoder_cache_hits, metrics.encoder_cache_misses) == (1, 1)
    assert metrics.encoder_cache_bytes == pipe.encoder_cache.nbytes > 0
    assert pipe.prefixes.hits == 1
    for ours, request in zip(results, requests):
        assert ours.token_ids == reference.generate_batch([request])[0].token_ids
    text = prometheus_text(metrics, "tiny")
    assert 'mmtrt_encoder_cache_hits_total{model="tiny"} 1.0' in text
    assert 'mmtrt_encoder_cache_misses_total{model="tiny"} 1.0' in text


def test_preprocessed_pixels_are_kept_by_the_decoded_image_and_never_shared(tiny_bundle, uncached, rng):
    cached = load(tiny_bundle)
    image = random_image(rng, 40, 56)
    changed = np.asarray(image).copy()
    changed[rng.integers(40), rng.integers(56), rng.integers(3)] ^= 1
    transposed = Image.fromarray(np.asarray(image).reshape(56, 40, 3))  # the same bytes at another size
    for img in (image, image.copy(), Image.fromarray(changed), transposed):
        assert np.array_equal(cached.pixel_values(img), uncached.pixel_values(img))
    assert (cached.pixel_cache.hits, cached.pixel_cache.misses) == (1, 3) and not uncached.pixel_cache.entries
