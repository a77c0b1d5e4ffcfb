"""Qwen2-VL and Qwen2.5-VL bundles decode what transformers' `generate` decodes, for images of every shape the
envelope allows; a batch of images of different sizes equals each alone; cast_precision's fp16 graphs stay close;
the C++ runtime refuses the bundle in one line; inspect shows the TensorRT-LLM build; TensorRT-RTX builds their
TensorRT segments."""

import json
import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from builders import decided_steps, hf_greedy, random_image
from conftest import QWEN_FAMILIES
from cpp_harness import PROGRAM
from mmtrt.cli import main
from mmtrt.errors import UserError
from mmtrt.ir.graph import Component
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.runtime.qwen2_vl import QwenImages
from mmtrt.zoo.tiny_qwen2_vl import build_tiny_qwen2_vl
from passes.precision.cast_precision import CastPrecision

PROMPT = "What is in the picture?"
NEW_TOKENS = 8
# (height, width): square, very wide, very tall, the smallest (min_pixels: 4 tokens) and the largest (max_pixels:
# 20 tokens, 112 x 140) the tiny processors allow
IMAGES = {"square": (64, 64), "wide": (40, 700), "tall": (700, 40), "smallest": (20, 20), "largest": (112, 140)}


@pytest.fixture(scope="module", params=QWEN_FAMILIES)
def qwen(request, qwen_bundle):
    model, processor = build_tiny_qwen2_vl(request.param)  # the saved checkpoint's weights (fixed seed)
    bundle = qwen_bundle(request.param)
    return model, processor, load(bundle, threads=1), bundle


@pytest.mark.parametrize("shape", list(IMAGES))
def test_greedy_tokens_equal_generate(qwen, rng, shape):
    model, processor, pipe, _ = qwen
    for _ in range(5):  # a random image whose first steps are near ties cannot tell right from wrong: draw again
        image = random_image(rng, *IMAGES[shape])
        ids, want, margins = hf_greedy(model, processor, image, PROMPT, NEW_TOKENS)
        decided = decided_steps(margins)
        if decided >= min(len(margins), 3):
            break
    assert decided >= min(len(margins), 3), f"five random images all had early near ties: {margins}"
    got = pipe.generate(image, PROMPT, max_new_tokens=NEW_TOKENS)
    assert got.prompt_tokens == len(ids)
    assert got.image_tokens == ids.count(model.config.image_token_id)
    assert got.token_ids[:decided] == want[:decided]
    assert len(got.token_ids) == len(want) or decided < len(margins)  # the same EOS, where every step is decided


def test_batch_of_sizes_equals_each_alone(qwen, rng):
    _, _, pipe, _ = qwen
    images = [random_image(rng, *IMAGES[s]) for s in ("wide", "square", "largest")]
    batch = pipe.generate_batch([Request(img, PROMPT, NEW_TOKENS) for img in images])
    for img, together in zip(images, batch):
        alone = pipe.generate(img, PROMPT, max_new_tokens=NEW_TOKENS)
        decided = decided_steps(alone.margins)
        assert together.token_ids[:decided] == alone.token_ids[:decided]
    assert len({g.image_tokens for g in batch}) == 3


def test_image_beyond_the_token_budget_is_refused(qwen, rng):
    _, _, pipe, _ = qwen
    with pytest.raises(UserError, match=r"^image is 600x3; .* takes \d+ image tokens, more than the bundle's 20 "):
        pipe.generate(random_image(rng, 3, 600), PROMPT, max_new_tokens=2)


def test_fp16_vision_and_llm_stay_close(qwen, rng):
    """cast_precision on the TensorRT segments of the exported graphs (2-D rotary and window masks stay fp32)."""
    _, _, pipe, bundle = qwen
    graphs = {name: onnx.load(bundle / f"{name}.onnx") for name in ("vision", "llm")}

    class IR:  # the components cast_precision reads, each offered TensorRT
        components = {name: Component(name, [], [], onnx=onnx.load(bundle / f"{name}.onnx"),
                                      metadata={"placement": {"targeted": True, "min_segment_size": 1}})
                      for name in CastPrecision.components}

    CastPrecision(CastPrecision.Config(dtype="fp16")).run(IR)
    patches = QwenImages(pipe.manifest, pipe.preprocess_spec).pixels(random_image(rng, 90, 200))
    vision_feeds = QwenImages(pipe.manifest, pipe.preprocess_spec).vision_feeds(patches)
    llm = pipe.model["llm"]
    llm_feeds = {"inputs_embeds": rng.normal(size=(1, 9, llm["hidden_size"])).astype(np.float32),
                 "attention_mask": np.ones((1, 9), np.int64),
                 "position_ids": np.stack([np.arange(9), np.arange(9) // 2, np.arange(9) % 3])[:, None],
                 "logits_from": np.zeros(1, np.int64),
                 **{s.name: np.zeros((1, llm["num_kv_heads"], 0, llm["head_dim"]), np.float32)
                    for s in pipe.specs["llm"] if s.name.startswith("past.")}}
    for name, feeds, output in (("vision", vision_feeds, "image_features"), ("llm", llm_feeds, "logits")):
        lowered = IR.components[name].onnx
        assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in lowered.graph.initializer)
        want, got = (ort.InferenceSession(m.SerializeToString()).run([output], feeds)[0]
                     for m in (graphs[name], lowered))
        assert 0 < np.abs(got - want).max() / np.abs(want).max() < 1e-2, name


@pytest.mark.skipif(not PROGRAM.is_file(), reason=f"{PROGRAM} is not built; run `make cpp`")
def test_cpp_runtime_refuses_the_bundle_in_one_line(qwen, rng, tmp_path):
    model, *_, bundle = qwen
    image = tmp_path / "image.png"
    random_image(rng, 40, 60).save(image)
    proc = subprocess.run([str(PROGRAM), str(bundle), "--image", str(image), "--prompt", PROMPT], capture_output=True,
                          text=True, timeout=120)
    family = model.config.model_type
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"mmtrt-run: error: {bundle} holds a {family} model; the C++ runtime does not "
                                        "run Qwen2-VL (its dynamic-resolution preprocessing and M-RoPE positions are "
                                        "implemented in the Python runtime only); run it with `mmtrt run`"]


def test_inspect_of_a_plain_bundle_names_what_each_partition_needs_and_no_tensorrt_llm(qwen):
    """A plain recipe writes no TensorRT-LLM checkpoint (one that opts in: test_qwen2_vl_passes.py); each partition
    says in a line what its plan needs, and what this host runs, without the import errors."""
    from mmtrt.bundle.inspect import describe, describe_placement

    text, placement = describe(qwen[3]), describe_placement(qwen[3])
    assert "this host: numpy" in text and "this host: onnxruntime; tensorrt needs a CUDA GPU" in text
    assert "importable" not in text and "tensorrt-llm" not in text and "tensorrt-llm" not in placement
    assert not (qwen[3] / "trtllm").exists()


def test_tensorrt_rtx_builds_the_vision_tower_and_llm_placement_gave_tensorrt(qwen, tmp_path, capsys):
    """Placement gives TensorRT every node of the vision tower (2-D rotary; window attention's 4-D mask in 2.5) and
    of the M-RoPE LLM; TensorRT-RTX's real parser and builder take each segment (built here, not run)."""
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is installed by `make test` (pyproject extra rtx)")
    bundle = shutil.copytree(qwen[3], tmp_path / "b")
    placement = load(bundle).manifest["placement"]
    for name in ("vision", "llm"):
        assert {n["backend"] for n in placement[name]["nodes"]} == {"tensorrt"}, name
    assert main(["build-engines", str(bundle), "--target", "rtx", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["segment"], r["status"]) for r in records] == [("vision.0", "built"), ("llm.0", "built")]
