"""The static KV cache where ONNX Runtime owns the buffers, as on onnxruntime-gpu's CUDA memory (which numpy cannot
address): the same code path run on the CPU device, with the row copies done by ONNX Runtime through IOBinding
(mmtrt/runtime/row_copy.py). A batch larger than the envelope (rows reused as sequences finish out of order: row
copies) and repeated questions on an image (prefixes saved and loaded) give the tokens of the numpy-owned cache."""

import numpy as np

from builders import random_image
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request, StaticStepper
from mmtrt.runtime.kv import StaticCache
from mmtrt.runtime.row_copy import RowCopier

QUESTIONS = ["What is it?", "What color is it?", "Where is it?"]


def onnxruntime_owned(pipe):
    """The pipeline's stepper over a cache whose buffers ONNX Runtime allocates and copies."""
    host = pipe.stepper.cache
    cache = StaticCache(pipe.kv, pipe.model["llm"], host.rows, host.capacity, "cpu", ["CPUExecutionProvider"])
    assert cache.copier is not None and not hasattr(cache, "host")
    pipe.stepper = StaticStepper(pipe.stepper.session, cache)
    return pipe


def test_onnxruntime_owned_cache_generates_the_host_caches_tokens(tiny_static_bundle, rng):
    ours, reference = onnxruntime_owned(load(tiny_static_bundle)), load(tiny_static_bundle)
    words = ["red", "cat", "under", "the", "blue", "table"]
    image = random_image(rng, 70, 90)
    requests = [Request(random_image(rng, 40, 60), " ".join(rng.choice(words, int(rng.integers(1, 12)))),
                        int(rng.integers(2, 20))) for _ in range(6)] + [Request(image, q, 8) for q in QUESTIONS]
    got = ours.generate_batch(requests)
    want = reference.generate_batch(requests)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    again = ours.generate(image, QUESTIONS[0], 8)  # the image's prefix, saved above, loaded into a row
    assert ours.prefixes.hits >= 1 and again.token_ids == reference.generate(image, QUESTIONS[0], 8).token_ids


def test_row_copies_on_onnxruntime_memory(rng):
    """Each copy against numpy on random rows: a row into a row, host rows into a row, a row's head to the host."""
    import onnxruntime as ort

    rows, shape = 3, (2, 16, 8)
    buffer = ort.OrtValue.ortvalue_from_numpy(rng.standard_normal((rows, *shape)).astype(np.float16), "cpu", 0)
    before = buffer.numpy().copy()
    copier, row_bytes = RowCopier("cpu", np.float16, ["CPUExecutionProvider"], shape), int(np.prod(shape)) * 2
    at = lambda r: buffer.data_ptr() + r * row_bytes
    copier.row_to_row(at(0), at(2))
    np.testing.assert_array_equal(buffer.numpy()[2], before[0])
    prefix = rng.standard_normal((2, 5, 8)).astype(np.float16)
    copier.host_to_row(prefix, at(1))
    np.testing.assert_array_equal(buffer.numpy()[1, :, :5], prefix)
    assert not buffer.numpy()[1, :, 5:].any()
    np.testing.assert_array_equal(copier.row_to_host(at(2), 7), before[0, :, :7])
    np.testing.assert_array_equal(buffer.numpy()[0], before[0])  # the source rows are untouched
