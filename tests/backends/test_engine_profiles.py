"""Engines get one optimization profile per phase (an LLM segment: decode, then prefill), the runner picks the
profile that holds a call's shapes, and the trtexec line builds what build-engines builds, under the engine name
the runtime looks up."""

import shutil

import numpy as np
import pytest

from mmtrt.backends.tensorrt.engines import Target, engine_file, select
from mmtrt.backends.tensorrt.plan import trtexec_command
from mmtrt.backends.tensorrt.runner import choose_profile
from mmtrt.bundle.manifest import read_manifest
from mmtrt.errors import UserError

H100_TRT11 = Target("9.0", "11.1.0")


def plan(bundle):
    return {e["id"]: e for e in read_manifest(bundle)["tensorrt"]["segments"]}


def test_llm_segments_get_decode_and_prefill_profiles(tiny_bundle):
    m = read_manifest(tiny_bundle)
    typical = m["envelope"]["prompt_tokens"]["opt"] + m["model"]["vision"]["image_tokens"]
    dims = m["dims"]
    vision, llm = plan(tiny_bundle)["vision.0"], plan(tiny_bundle)["llm.0"]
    assert vision["profiles"] == [{"name": "all", "shapes": m["profiles"]["vision"]}]
    decode, prefill = (p["shapes"] for p in llm["profiles"])
    assert [p["name"] for p in llm["profiles"]] == ["decode", "prefill"]
    embeds = decode["inputs_embeds"]
    assert [embeds[p][1] for p in ("min", "opt", "max")] == [1, 1, 1]
    assert decode["past.0.key"]["opt"][2] == dims["past"]["opt"]
    embeds = prefill["inputs_embeds"]
    assert [embeds[p][1] for p in ("min", "opt", "max")] == [1, typical, dims["seq"]["max"]]
    assert prefill["past.0.key"]["opt"][2] == 0 and prefill["past.0.key"]["max"][2] == dims["past"]["max"]
    assert prefill["attention_mask"]["opt"][1] == typical
    assert prefill["attention_mask"]["max"][1] == dims["total"]["max"]


def test_the_runner_selects_the_profile_that_holds_the_shapes(tiny_bundle):
    profiles = plan(tiny_bundle)["llm.0"]["profiles"]
    hidden = profiles[0]["shapes"]["inputs_embeds"]["min"][2]
    kv = profiles[0]["shapes"]["past.0.key"]["min"]

    def shapes(seq, past):
        return {"inputs_embeds": (1, seq, hidden), "attention_mask": (1, past + seq), "position_ids": (1, seq),
                "past.0.key": (1, kv[1], past, kv[3])}

    assert choose_profile(profiles, shapes(1, 40)) == 0
    assert choose_profile(profiles, shapes(30, 0)) == 1
    assert choose_profile(profiles, shapes(5, 20)) == 1
    with pytest.raises(UserError, match="fit none of the engine's profiles"):
        choose_profile(profiles, shapes(10_000, 0))


def test_trtexec_line_matches_build_engines(tiny_bundle, tmp_path):
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    llm = plan(bundle)["llm.0"]
    line = trtexec_command(llm, H100_TRT11)
    assert "--noTF32" in line.split() and f"--onnx={llm['tensorrt_onnx']}" in line.split()
    assert line.index("--profile=0") < line.index("--optShapes=") < line.index("--profile=1")
    assert line.count("--minShapes=") == 2 and "{" not in line
    saved = next(p for p in line.split() if p.startswith("--saveEngine=")).split("=", 1)[1]
    assert saved == engine_file(llm, H100_TRT11)
    # an engine trtexec wrote under that name is what the runtime selects on that target, index or not
    assert select(bundle, llm, H100_TRT11, {})[0] is None
    (bundle / saved).parent.mkdir(exist_ok=True)
    (bundle / saved).write_bytes(b"engine bytes")
    path, why = select(bundle, llm, H100_TRT11, {})
    assert path == bundle / engine_file(llm, H100_TRT11) and "built outside build-engines" in why


def test_polygraphy_runner_switches_profile_per_call(tiny_bundle, tmp_path, monkeypatch):
    """The selection around Polygraphy's TrtRunner.infer_impl, which needs TensorRT to run: here it is replaced by
    a recorder, so only mmtrt's switching is under test (the engine itself has not run anywhere)."""
    from polygraphy.backend.trt import TrtRunner

    from mmtrt.backends.tensorrt.runner import trt_runner

    profiles = plan(tiny_bundle)["llm.0"]["profiles"]
    hidden = profiles[0]["shapes"]["inputs_embeds"]["min"][2]
    (tmp_path / "x.engine").write_bytes(b"engine")
    runner = trt_runner(tmp_path / "x.engine", profiles, "llm")
    switched, ran = [], []
    monkeypatch.setattr(TrtRunner, "infer_impl", lambda self, feeds, *a, **k: ran.append(self.active) or {})
    runner.set_profile = switched.append
    for seq in (30, 1, 1, 12):
        runner.infer_impl({"inputs_embeds": np.zeros((1, seq, hidden), np.float32)})
    assert switched == [1, 0, 1] and ran == [1, 0, 0, 1]
