"""Engine keys, engine selection and the fallback to ONNX Runtime; the build plan and the trtllm-build command.
Building and running engines needs TensorRT and a GPU: those tests skip here, saying so."""

import importlib.util
import json
import logging
import shutil

import numpy as np
import pytest

from builders import random_image
from mmtrt.backends.tensorrt.flavors import TENSORRT
from mmtrt.backends.tensorrt.engines import (
    Target,
    engine_file,
    engine_key,
    probe_target,
    read_index,
    select,
    write_bytes,
    write_index,
)
from mmtrt.handoff.trtllm_engines import SEGMENT as TRTLLM
from mmtrt.bundle.manifest import read_manifest, sha256_file
from mmtrt.cli import main
from mmtrt.runtime import load

H100_TRT11 = Target("9.0", "11.1.0")
RUNS_ENGINES = isinstance(probe_target(), Target)
HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


def vision_entry(bundle):
    return next(e for e in read_manifest(bundle)["tensorrt"]["segments"] if e["id"] == "vision.0")


def test_the_key_changes_with_everything_an_engine_depends_on(tiny_bundle):
    entry = vision_entry(tiny_bundle)
    key = engine_key(entry, H100_TRT11)
    shapes = entry["profiles"][0]["shapes"]
    other_profile = {**entry, "profiles": [{"name": "all", "shapes": {
        "pixel_values": {**shapes["pixel_values"], "max": [8, 3, 64, 64]}}}]}
    variants = [engine_key({**entry, "sha256": "0" * 64}, H100_TRT11), engine_key(other_profile, H100_TRT11),
                engine_key(entry, Target("8.9", "11.1.0")), engine_key(entry, Target("9.0", "11.2.0"))]
    assert len({key, *variants}) == 5
    assert key.endswith("-sm90-trt11.1.0") and key.startswith(entry["sha256"][:16])


def fake_engine(bundle, entry, target, content=b"not a real engine"):
    """An index record as build-engines writes it; the selection logic reads nothing else."""
    path = bundle / engine_file(entry, target)
    write_bytes(path, content)
    index = read_index(bundle)
    index[engine_key(entry, target)] = {"segment": entry["id"], "file": engine_file(entry, target),
                                        "sha256": sha256_file(path), "target": target.tag()}
    write_index(bundle, index)
    return path


def test_selection_matches_the_host_or_says_why_not(tiny_bundle, tmp_path):
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    entry = vision_entry(bundle)
    assert select(bundle, entry, "tensorrt is not importable on this host", {}) == (None, "tensorrt is not importable on this host")
    path, why = select(bundle, entry, H100_TRT11, read_index(bundle))
    assert path is None and "no engine for vision.0 matches sm90-trt11.1.0" in why and "build-engines" in why
    fake_engine(bundle, entry, Target("8.9", "11.1.0"))
    path, why = select(bundle, entry, H100_TRT11, read_index(bundle))
    assert path is None and "built for: sm89-trt11.1.0" in why
    built = fake_engine(bundle, entry, H100_TRT11)
    assert select(bundle, entry, H100_TRT11, read_index(bundle))[0] == built
    built.write_bytes(b"tampered")
    path, why = select(bundle, entry, H100_TRT11, read_index(bundle))
    assert path is None and "missing or modified" in why


def test_an_unbuildable_segment_falls_back_with_its_reason(tiny_bundle):
    entry = {**vision_entry(tiny_bundle), "profiles": None, "unbuildable": "x has dimension 'n', which the shape plan does not cover"}
    assert select(tiny_bundle, entry, H100_TRT11, {}) == (None, f"vision.0 has no TensorRT profile ({entry['unbuildable']})")


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.skipif(RUNS_ENGINES or importlib.util.find_spec("tensorrt_llm") is not None,
                    reason="this host has TensorRT or TensorRT-LLM: the fallback under test does not happen")
def test_runtime_falls_back_once_and_reports_why(tiny_trtllm_bundle, rng):
    handler = Records()
    logger = logging.getLogger("mmtrt.runtime")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        pipe = load(tiny_trtllm_bundle)
        first = pipe.generate(random_image(rng, 40, 50), "hi", max_new_tokens=3)
        second = pipe.generate(random_image(rng, 40, 50), "ho", max_new_tokens=3)
    finally:
        logger.removeHandler(handler)
    assert set(first.fallbacks) == {"vision.0", "llm.0", TRTLLM} and first.fallbacks == second.fallbacks
    assert all("tensorrt" in why for why in first.fallbacks.values())
    messages = [r.getMessage() for r in handler.records]  # once per load: the TensorRT segments, the TensorRT-LLM LLM
    assert len(messages) == 2 and "vision.0, llm.0 run on ONNX Runtime" in messages[0]
    assert messages[1].startswith("the LLM runs on ONNX Runtime, not TensorRT-LLM: tensorrt_llm")
    assert json.loads(json.dumps(first.to_json()))["fallbacks"] == first.fallbacks


@pytest.mark.skipif(HAS_TENSORRT, reason="tensorrt is installed here")
def test_build_engines_without_tensorrt_is_one_line_naming_what_installs(tiny_bundle, capsys):
    assert main(["build-engines", str(tiny_bundle), "--segment", "vision.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mmtrt: error: build-engines --target tensorrt needs tensorrt") and len(err.splitlines()) == 1
    assert TENSORRT.install in err and "mmtrt[tensorrt]" not in err


def test_build_plan_prints_profiles_and_commands(tiny_bundle, capsys):
    assert main(["build-engines", str(tiny_bundle), "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    entries = {e["id"]: e for e in plan["segments"]}
    assert [p["name"] for p in entries["llm.0"]["profiles"]] == ["decode", "prefill"]
    assert entries["llm.0"]["profiles"][0]["shapes"]["past.0.key"]["min"][2] == 0
    assert entries["vision.0"]["profiles"][0]["shapes"]["pixel_values"]["max"] == [4, 3, 64, 64]
    assert entries["vision.0"]["command"] == f"mmtrt build-engines {tiny_bundle} --target tensorrt --segment vision.0"
    if plan["resolved"] is None:  # no TensorRT GPU here: no engine names, no trtexec line with a hole in it
        assert "tensorrt" in plan["unresolved"] and "trtexec" not in entries["vision.0"]
    assert main(["build-engines", str(tiny_bundle), "--plan"]) == 0
    text = capsys.readouterr().out
    assert "profile prefill:" in text and "{" not in text


def test_trtllm_command_takes_its_limits_from_the_shape_plan(tiny_trtllm_bundle):
    m = read_manifest(tiny_trtllm_bundle)
    plan, dims = m["tensorrt_llm"], m["dims"]
    tokens = m["model"]["vision"]["image_tokens"]
    assert plan["limits"] == {"max_batch_size": dims["batch"]["max"], "max_input_len": dims["seq"]["max"],
                              "max_seq_len": dims["total"]["max"], "max_multimodal_len": dims["batch"]["max"] * tokens,
                              "max_num_tokens": dims["batch"]["max"] * dims["seq"]["max"]}
    for key, value in plan["limits"].items():
        assert f"--{key} {value}" in plan["command"]
    assert plan["checkpoint"] == "trtllm/checkpoint" and plan["checkpoint_missing"] is None  # the float checkpoint
    assert "--kv_cache_type paged" in plan["command"] and "--tokens_per_block" not in plan["command"]  # no kv_layout


def test_build_and_compare_an_engine_on_a_tensorrt_host(tiny_bundle, tmp_path, rng):
    pytest.importorskip("tensorrt", reason="needs TensorRT 11 and a GPU; run scripts/gpu_check.sh on such a host")
    from mmtrt.backends.tensorrt.build import build_engines
    from mmtrt.backends.onnxruntime_backend import OrtRunner
    from mmtrt.backends.tensorrt.runner import EngineRunner

    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    records = build_engines(bundle, ["vision.0"], log=lambda line: None)
    assert records[0]["status"] == "built"
    assert build_engines(bundle, ["vision.0"], log=lambda line: None)[0]["status"] == "up to date"
    pixels = {"pixel_values": rng.normal(size=(2, 3, 64, 64)).astype(np.float32)}
    want = OrtRunner(bundle / "vision.onnx").run(pixels)["image_features"]
    got = EngineRunner(bundle / records[0]["file"]).run(pixels)["image_features"]
    np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-3)
