"""The manifest plans for the target, never the compiling host: the same recipe gives the same manifest whether
or not TensorRT and TensorRT-LLM are importable here, a TensorRT-only recipe compiles on a CPU host, and what
this host runs is reported separately ("this host: ...")."""

import json

import numpy as np
import pytest

import mmtrt.backends
from builders import random_image
from conftest import compile_to
from mmtrt.bundle.inspect import describe, inspect_json
from mmtrt.bundle.manifest import read_manifest
from mmtrt.runtime import load

TENSORRT_ONLY = ("model: {source: zoo, name: tiny-llava}\n"
                 "partition: {vision: [tensorrt], llm: [tensorrt-llm, tensorrt]}\n"
                 "envelope: {prompt_tokens: {min: 1, opt: 8, max: 32}, max_new_tokens: 4}\n")


def _everything_importable(monkeypatch):
    """The host probes say every backend imports and a GPU is visible (TensorRT's own API is not touched)."""
    monkeypatch.setattr(mmtrt.backends, "_import_error", lambda module: None)
    monkeypatch.setattr(mmtrt.backends, "_has_cuda_gpu", lambda: True)


@pytest.fixture(scope="module")
def here(tmp_path_factory):
    return compile_to(tmp_path_factory.mktemp("host"), TENSORRT_ONLY, "here")


@pytest.mark.exports  # the host must not change the export either
def test_manifest_is_the_same_on_every_host(here, tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        _everything_importable(m)
        assert mmtrt.backends.unavailable_reason("tensorrt-llm") is None
        gpu_host = compile_to(tmp_path, TENSORRT_ONLY, "gpu-host")
    assert (here / "manifest.json").read_bytes() == (gpu_host / "manifest.json").read_bytes()
    partitions = read_manifest(here)["partitions"]
    assert partitions["vision"]["planned"] == "tensorrt" and partitions["llm"]["planned"] == "tensorrt-llm"
    assert "importable" not in json.dumps(partitions)


def test_this_host_is_reported_apart_from_the_plan(here, monkeypatch, rng):
    bundle = here
    host = inspect_json(bundle)["this_host"]
    assert host["vision"].startswith("onnxruntime (") and "tensorrt" in host["vision"]
    assert host["llm"].startswith("onnxruntime (") and "tensorrt-llm: tensorrt_llm is not importable" in host["llm"]
    text = describe(bundle)
    assert "planned tensorrt-llm" in text and "this host: onnxruntime; tensorrt-llm needs a CUDA GPU" in text
    assert "importable" not in text  # the reasons stay in the JSON
    # the plan's probes saying every backend imports does not make an engine: inspect must not claim one runs
    _everything_importable(monkeypatch)
    assert inspect_json(bundle)["this_host"]["llm"].startswith("onnxruntime (")
    monkeypatch.undo()
    result = load(bundle).generate(random_image(rng, 30, 40), "hi", max_new_tokens=2)
    assert len(result.token_ids) >= 1 and np.all(np.array(result.token_ids) >= 0)
