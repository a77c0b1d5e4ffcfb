"""The C++ sampler draws the Python sampler's tokens: the same seed, generator (numpy's PCG64) and arithmetic."""

import ctypes
import subprocess

import numpy as np
import pytest

from builders import random_image
from cpp_harness import PROGRAM, CApi, generate_cpp, needs_build, needs_library
from mmtrt.errors import UserError
from mmtrt.runtime import load
from mmtrt.runtime.sampling import Sampler, SamplingParams

pytestmark = needs_build
VOCAB = 500
# A float64 exp may round differently in the last bit in C++ and in numpy; a draw that close to a boundary
# between two tokens' shares (far below any real logit difference) may pick the neighbour.
BOUNDARY = 1e-9


def c_sampling(lib, params: SamplingParams):
    handle = ctypes.c_void_p()
    assert lib.mmtrt_sampling_create(ctypes.byref(handle)) == 0
    for name in ("temperature", "top_p", "repetition_penalty"):
        assert lib.mmtrt_sampling_set_float(handle, name.encode(), ctypes.c_double(getattr(params, name))) == 0
    assert lib.mmtrt_sampling_set_int(handle, b"top_k", ctypes.c_int64(params.top_k)) == 0
    assert lib.mmtrt_sampling_set_seed(handle, ctypes.c_uint64(params.seed)) == 0
    return handle


@pytest.fixture(scope="module")
def lib():
    lib = CApi().lib
    P = ctypes.c_void_p
    lib.mmtrt_sampling_create.argtypes = [ctypes.POINTER(P)]
    lib.mmtrt_sampling_set_float.argtypes = [P, ctypes.c_char_p, ctypes.c_double]
    lib.mmtrt_sampling_set_int.argtypes = [P, ctypes.c_char_p, ctypes.c_int64]
    lib.mmtrt_sampling_set_seed.argtypes = [P, ctypes.c_uint64]
    lib.mmtrt_sampling_free.argtypes = [P]
    lib.mmtrt_sampler_create.argtypes = [P, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t, ctypes.c_size_t,
                                         ctypes.POINTER(P)]
    lib.mmtrt_sampler_choose.argtypes = [P, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int32)]
    lib.mmtrt_sampler_free.argtypes = [P]
    return lib


@needs_library
@pytest.mark.parametrize("params", [
    dict(temperature=1.0), dict(temperature=0.7, top_k=30), dict(temperature=1.2, top_p=0.85),
    dict(temperature=0.9, top_k=100, top_p=0.9, repetition_penalty=1.3), dict(repetition_penalty=1.5)])
def test_the_c_sampler_chooses_the_python_samplers_tokens(lib, params, rng):
    params = SamplingParams(seed=int(rng.integers(2**64, dtype=np.uint64)), **params)
    prompt = [int(t) for t in rng.integers(0, VOCAB, 20)]
    logits = rng.normal(0, 3, (60, VOCAB)).astype(np.float32)
    python = Sampler(params, prompt, VOCAB)
    settings = c_sampling(lib, params)
    sampler = ctypes.c_void_p()
    ids = (ctypes.c_int32 * len(prompt))(*prompt)
    assert lib.mmtrt_sampler_create(settings, ids, len(prompt), VOCAB, ctypes.byref(sampler)) == 0
    token = ctypes.c_int32()
    for step, row in enumerate(logits):
        want, margin = python.choose(row)
        assert lib.mmtrt_sampler_choose(sampler, row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                        ctypes.byref(token)) == 0
        if token.value != want:
            assert margin < BOUNDARY, f"step {step}: {token.value} != {want}, the draw {margin} from a boundary"
            break
    lib.mmtrt_sampler_free(sampler)
    lib.mmtrt_sampling_free(settings)


@needs_library
def test_values_outside_their_ranges_are_refused_with_pythons_message(lib):
    settings = c_sampling(lib, SamplingParams(seed=1))
    for name, value in ((b"top_p", 1.5), (b"temperature", -1.0), (b"repetition_penalty", 0.0)):
        assert lib.mmtrt_sampling_set_float(settings, name, value) == 3  # MMTRT_ERR_INPUT
        message = lib.mmtrt_last_error().decode()
        with pytest.raises(UserError) as err:
            SamplingParams(**{name.decode(): value}).validate()
        assert message == str(err.value)
    assert lib.mmtrt_sampling_set_int(settings, b"top_k", -5) == 3
    assert lib.mmtrt_sampling_set_float(settings, b"colour", 1.0) == 1  # MMTRT_ERR_ARGUMENT
    lib.mmtrt_sampling_free(settings)


def draw_with_a_stop_character(pipe, image, rng):
    """A seed whose sampled text holds a printable ASCII character after its first three (a random model's text
    may be short or all other bytes): the seed, Python's generation and that character."""
    for _ in range(20):
        seed = int(rng.integers(2**32))
        theirs = pipe.generate(image, "Tell a story.", sampling=SamplingParams(24, 0.9, 0.9, 60, seed, 1.2))
        stop = next((c for c in theirs.text[3:] if c.isascii() and c.isprintable()), None)
        if stop is not None:
            return seed, theirs, stop
    raise AssertionError("20 seeds gave no printable ASCII character to stop at")


def test_mmtrt_run_samples_and_stops_as_mmtrt_run_does(tiny_bundle, tmp_path, rng):
    pipe = load(tiny_bundle, threads=1)
    image = tmp_path / "a.png"
    random_image(rng, 50, 70).save(image)
    seed, theirs, stop = draw_with_a_stop_character(pipe, image, rng)
    flags = ["--temperature", "0.9", "--top-p", "0.9", "--top-k", "60", "--seed", str(seed),
             "--repetition-penalty", "1.2", "--max-new-tokens", "24"]
    ours = generate_cpp(tiny_bundle, image, "Tell a story.", *flags)
    assert ours["token_ids"] == theirs.token_ids and ours["text"] == theirs.text
    assert ours["finish_reason"] == theirs.finish_reason
    cut = generate_cpp(tiny_bundle, image, "Tell a story.", *flags, "--stop", stop)
    want = pipe.generate(image, "Tell a story.", sampling=SamplingParams(24, 0.9, 0.9, 60, seed, 1.2, (stop,)))
    assert cut["text"] == want.text == theirs.text[:theirs.text.index(stop)]
    assert cut["token_ids"] == want.token_ids and cut["finish_reason"] == "stop"
    bad = subprocess.run([str(PROGRAM), str(tiny_bundle), "--image", str(image), "--prompt", "x", "--top-p", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr == "mmtrt-run: error: sampling: top_p 0.0 is outside (0, 1]; " \
                                                 "pass a number in that range\n"
