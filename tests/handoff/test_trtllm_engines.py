"""TensorRT-LLM engines: the key, the planned command on this host, selection and its reasons, the skip where
tensorrt_llm is absent, and the prompt table the engine would embed. Building and running an engine needs
TensorRT-LLM and a GPU: that test skips here, saying so (scripts/gpu_check.sh runs it on a GPU host)."""

import importlib.util
import json
import shutil

import numpy as np
import pytest

from builders import random_image, read_safetensors
from mmtrt.backends.tensorrt.engines import read_index, write_bytes, write_index
from mmtrt.handoff.trtllm_engines import (
    ENGINE_FILE,
    SEGMENT,
    LlmTarget,
    build_command,
    build_llm_engine,
    llm_engine_dir,
    llm_engine_key,
    probe_llm_target,
    select_llm_engine,
)
from mmtrt.bundle.manifest import read_manifest, sha256_file
from mmtrt.cli import main
from mmtrt.runtime import load
from mmtrt.runtime.executors import llm_engine_choice
from mmtrt.handoff.trtllm_runner import prompt_table

H100 = LlmTarget("9.0", "0.20.0")
HAS_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None
RUNS_TRTLLM = isinstance(probe_llm_target(), LlmTarget)


def test_the_key_changes_with_everything_an_engine_depends_on(tiny_trtllm_bundle):
    m = read_manifest(tiny_trtllm_bundle)
    key = llm_engine_key(m, H100)
    other_weights = {**m, "artifacts": {**m["artifacts"], "trtllm/checkpoint/rank0.safetensors": "0" * 64}}
    plan = m["tensorrt_llm"]
    other_options = {**m, "tensorrt_llm": {**plan, "build_options": {**plan["build_options"], "tokens_per_block": 64}}}
    unrelated = {**m, "artifacts": {**m["artifacts"], "vision.onnx": "0" * 64}}
    variants = [llm_engine_key(other_weights, H100), llm_engine_key(other_options, H100),
                llm_engine_key(m, LlmTarget("8.9", "0.20.0")), llm_engine_key(m, LlmTarget("9.0", "0.21.0"))]
    assert len({key, *variants}) == 5 and llm_engine_key(unrelated, H100) == key
    assert key.startswith("llm-") and key.endswith("-sm90-trtllm0.20.0")


def test_the_command_on_this_host_is_the_planned_one_with_real_paths(tiny_trtllm_bundle, tmp_path):
    plan = read_manifest(tiny_trtllm_bundle)["tensorrt_llm"]
    words = build_command(tiny_trtllm_bundle, plan, tmp_path / "out", H100)
    assert not any("BUNDLE" in w for w in words)
    assert words[words.index("--checkpoint_dir") + 1] == str(tiny_trtllm_bundle / "trtllm" / "checkpoint")
    assert words[words.index("--output_dir") + 1] == str(tmp_path / "out")
    cache = str(tiny_trtllm_bundle / "engines" / "timing-sm90-trtllm0.20.0.trtllm.cache")
    assert words[words.index("--input_timing_cache") + 1] == words[words.index("--output_timing_cache") + 1] == cache
    for name, value in plan["build_options"].items():
        assert words[words.index(f"--{name}") + 1] == str(value)


def fake_engine(bundle, target):
    """An index record as build-engines writes it; the selection logic reads nothing else."""
    m = read_manifest(bundle)
    rel = llm_engine_dir(m, target)
    write_bytes(bundle / rel / ENGINE_FILE, b"not a real engine")
    index = read_index(bundle)
    index[llm_engine_key(m, target)] = {"segment": SEGMENT, "file": rel, "target": target.tag(),
                                        "sha256": sha256_file(bundle / rel / ENGINE_FILE)}
    write_index(bundle, index)
    return bundle / rel


def test_selection_matches_the_host_or_says_why_not(tiny_trtllm_bundle, tmp_path):
    bundle = shutil.copytree(tiny_trtllm_bundle, tmp_path / "b")
    m = read_manifest(bundle)
    absent = "tensorrt_llm is not importable on this host (ModuleNotFoundError: x)"
    assert select_llm_engine(bundle, m, absent, {}) == (None, absent)
    path, why = select_llm_engine(bundle, m, H100, read_index(bundle))
    assert path is None and "no TensorRT-LLM engine matches" in why and "sm90-trtllm0.20.0" in why
    assert "build-engines" in why
    fake_engine(bundle, LlmTarget("8.9", "0.20.0"))
    path, why = select_llm_engine(bundle, m, H100, read_index(bundle))
    assert path is None and "built for: sm89-trtllm0.20.0" in why
    built = fake_engine(bundle, H100)
    assert select_llm_engine(bundle, m, H100, read_index(bundle)) == (built, f"engine {llm_engine_dir(m, H100)}")
    (built / ENGINE_FILE).write_bytes(b"tampered")
    path, why = select_llm_engine(bundle, m, H100, read_index(bundle))
    assert path is None and "missing or modified" in why


def test_a_bundle_without_checkpoint_gives_its_reason_before_any_probe(tiny_trtllm_bundle):
    m = read_manifest(tiny_trtllm_bundle)
    missing = {**m, "tensorrt_llm": {**m["tensorrt_llm"], "checkpoint": None, "checkpoint_missing": "why not"}}
    assert select_llm_engine(tiny_trtllm_bundle, missing, H100, {}) == (None, "why not")
    assert llm_engine_choice(tiny_trtllm_bundle, missing) == (None, "why not")
    assert llm_engine_choice(tiny_trtllm_bundle, {**m, "tensorrt_llm": None}) == (None, None)


@pytest.mark.skipif(HAS_TRTLLM, reason="tensorrt_llm is installed here: the skip under test does not happen")
def test_build_is_skipped_with_the_reason_where_tensorrt_llm_is_absent(tiny_trtllm_bundle, capsys):
    lines = []
    record = build_llm_engine(tiny_trtllm_bundle, log=lines.append)
    assert record["status"] == "skipped" and record["reason"].startswith("tensorrt_llm is not importable")
    assert lines == [f"{SEGMENT}: skipped, {record['reason']}"]
    assert not (tiny_trtllm_bundle / "engines").exists() or not any((tiny_trtllm_bundle / "engines").glob("trtllm-*"))
    assert main(["build-engines", str(tiny_trtllm_bundle), "--plan", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["tensorrt_llm"]
    assert shown["command"] == read_manifest(tiny_trtllm_bundle)["tensorrt_llm"]["command"]
    assert shown["skipped"] == record["reason"]


def test_prompt_table_gives_the_llm_the_onnx_paths_embeddings_row_by_row(tiny_trtllm_bundle, rng):
    """What TensorRT-LLM's prompt-tuning embedding computes (id < vocab_size: the vocabulary's row, else row
    id - vocab_size of the request's table), from the checkpoint's vocabulary, equals the ONNX path's
    inputs_embeds: image rows exactly, text rows as the float16 checkpoint stores them."""
    pipe = load(tiny_trtllm_bundle)
    ids = pipe.prompt_ids("what is in the picture?")
    features = pipe.image_features(pipe.pixel_values(random_image(rng, 40, 50)))
    onnx_rows = pipe.embed(np.array([ids], np.int64), features)[0]
    folder = tiny_trtllm_bundle / "trtllm" / "checkpoint"
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    table_of_vocab = read_safetensors(folder / "rank0.safetensors")[0]["transformer.vocab_embedding.weight"]
    virtual, table = prompt_table(ids, features, pipe.model["image_token_id"], vocab)
    image = np.asarray(ids) == pipe.model["image_token_id"]
    assert image.sum() == pipe.model["vision"]["image_tokens"] == len(table)
    assert (virtual[~image] == np.asarray(ids)[~image]).all() and (virtual[~image] < vocab).all()
    assert (virtual[image] == vocab + np.arange(image.sum())).all()
    for row, v in enumerate(virtual):
        seen = table[v - vocab] if v >= vocab else table_of_vocab[v]
        expected = onnx_rows[row] if v >= vocab else onnx_rows[row].astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(seen, expected, err_msg=f"row {row} (id {ids[row]})")


def test_prompt_table_refuses_a_count_mismatch():
    with pytest.raises(ValueError, match="2 image tokens for 3 feature rows"):
        prompt_table([5, 9, 9, 1], np.ones((3, 4)), 9, 100)


@pytest.mark.skipif(not RUNS_TRTLLM, reason="needs tensorrt_llm and a CUDA GPU (scripts/gpu_check.sh runs it there)")
def test_engine_generates_what_onnx_runtime_generates(tiny_trtllm_bundle, tmp_path, rng):
    bundle = shutil.copytree(tiny_trtllm_bundle, tmp_path / "b")
    image = random_image(rng, 40, 50)
    reference = load(bundle).generate(image, "hi", max_new_tokens=6)
    assert build_llm_engine(bundle, log=lambda line: None)["status"] == "built"
    pipe = load(bundle)
    assert pipe.backends["llm"].startswith("tensorrt-llm")
    result = pipe.generate(image, "hi", max_new_tokens=6)
    assert result.token_ids[:2] == reference.token_ids[:2]  # fp16 engine vs fp32 ONNX: near ties may flip later
