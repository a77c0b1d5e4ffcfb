"""A speculative bundle's TensorRT forms: the LLM's segments get a verify profile (the last token and up to k
drafted ones), the early-exit draft is a TensorRT segment of its own (one token a call: the decode profile only)
that reads the LLM's weights, TensorRT-RTX's real builder builds both, and where no engine can run the draft falls
back to ONNX Runtime with the reason, decoding plain greedy tokens."""

import json
import shutil

import pytest

from builders import random_image
from conftest import ROOT, compile_to
from mmtrt.cli import main
from mmtrt.runtime import load

K = 4


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    recipe = (ROOT / "recipes" / "tiny-llava-fp16.yaml").read_text().replace(
        "envelope:", f"  - speculative: {{draft: early_exit, layers: 2, k: {K}}}\nenvelope:")
    return compile_to(tmp_path_factory.mktemp("spec-trt"), recipe, "spec.bundle")


def segments(bundle) -> dict[str, dict]:
    manifest = json.loads((bundle / "manifest.json").read_text())
    return {s["id"]: s for s in manifest["tensorrt"]["segments"]}


def seq_range(profile: dict) -> tuple[int, int, int]:
    shape = profile["shapes"]["inputs_embeds"]
    return shape["min"][1], shape["opt"][1], shape["max"][1]


def test_the_llm_has_a_verify_profile_and_the_draft_a_segment_of_its_own(bundle):
    planned = segments(bundle)
    llm = {p["name"]: seq_range(p) for p in planned["llm.0"]["profiles"]}
    assert list(llm) == ["decode", "verify", "prefill"]  # the runner takes the first profile that holds a call
    assert llm["decode"] == (1, 1, 1) and llm["verify"] == (1, K + 1, K + 1) and llm["prefill"][2] > K + 1
    draft = planned["draft.0"]
    assert [(p["name"], seq_range(p)) for p in draft["profiles"]] == [("all", (1, 1, 1))]
    assert draft["files"] == ["draft.onnx", "llm.onnx.data"]  # the LLM's weights, not a copy


def test_tensorrt_rtx_builds_the_draft_and_the_verifying_llm(bundle, tmp_path, capsys):
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is installed by `make test` (pyproject extra rtx)")
    copy = shutil.copytree(bundle, tmp_path / "b")
    assert main(["build-engines", str(copy), "--target", "rtx", "--json"]) == 0
    records = {r["segment"]: r["status"] for r in json.loads(capsys.readouterr().out)}
    assert records == {"vision.0": "built", "llm.0": "built", "draft.0": "built"}


def test_without_a_runnable_engine_the_draft_runs_on_onnxruntime_and_gives_plain_tokens(bundle, rng):
    pipe = load(bundle, threads=1, prefix_cache_mib=0)
    assert "draft.0" in pipe.fallbacks  # with the reason, as every segment's
    image, prompt = random_image(rng, 64, 48), "one two three one two three one two"
    drafted = pipe.generate(image, prompt, 24)
    pipe.speculative = None
    assert drafted.token_ids == pipe.generate(image, prompt, 24).token_ids
    assert drafted.speculative["proposed"] > 0
