"""The parity suite on checkpoints whose chat template writes the BOS token itself (Mistral's and Gemma's do):
its PyTorch reference must tokenize as the bundle does, and the two must agree; and on Qwen2-VL, whose M-RoPE
positions the suite must feed, as must the agreement suite (an accuracy budget's) after an image."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import compile_to
from builders import random_image
from mmtrt.eval.agreement import agreement_suite
from mmtrt.eval.source import source_model
from mmtrt.eval import parity
from mmtrt.eval.parity import parity_references, parity_suite
from mmtrt.eval.userdata import Sample
from mmtrt.runtime import load
from mmtrt.zoo.tiny_llava import build_tiny_llava

FAMILIES = {
    "mistral": dict(llm="mistral"),
    "gemma": dict(llm="gemma", head_dim=48),  # Gemma's head_dim is not hidden / heads
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def bos_bundle(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "checkpoint"
    model, processor = build_tiny_llava(image_size=32, vision_hidden=32, vision_layers=2, hidden=64, layers=2,
                                        **FAMILIES[request.param])
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder, compile_to(folder.parent, "model: {source: hf, path: checkpoint}\n")


def test_parity_reference_adds_no_second_bos(bos_bundle):
    folder, bundle = bos_bundle
    pipe = load(bundle)
    model, processor = source_model(pipe.manifest, folder)
    assert processor.chat_template.startswith("{{ bos_token }}")
    bos = processor.tokenizer.bos_token_id
    ids = pipe.prompt_ids("hi")
    assert ids[0] == bos and ids[1] != bos
    report = parity_suite(pipe, limit=2, source=(model, processor))
    assert report["metrics"]["top1_agreement_pct"] == 100.0
    assert report["metrics"]["max_abs_logit_diff"] < 1e-3
    assert report["metrics"]["greedy_identical_pct"] == 100.0


def test_the_cli_runs_the_source_first_and_gives_the_suites_numbers(bos_bundle, tmp_path):
    """`mmtrt eval --suite parity` computes the PyTorch side before it loads the bundle, its logits mapped back
    from files: the same references and the same metrics as the suite with both models loaded."""
    folder, bundle = bos_bundle
    pipe = load(bundle)
    source = source_model(pipe.manifest, folder)
    held, mapped = parity_references(source, pipe.image_side, 2), parity_references(source, pipe.image_side, 2, tmp_path)
    assert [r.ids for r in mapped] == [r.ids for r in held] and [r.answer for r in mapped] == [r.answer for r in held]
    for r, m in zip(held, mapped):
        assert isinstance(m.logits, np.memmap)
        np.testing.assert_array_equal(np.asarray(m.logits), r.logits)
    done = subprocess.run([sys.executable, "-m", "mmtrt.cli", "eval", str(bundle), "--suite", "parity", "--limit", "2",
                           "--source-model", str(folder), "--json"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    cli = json.loads(done.stdout.strip().splitlines()[-1])
    assert cli["metrics"] == parity_suite(pipe, limit=2, references=held)["metrics"]


def test_parity_feeds_mrope_positions(qwen_checkpoints, qwen_bundle):
    """Qwen2-VL's LLM takes three rows of positions from the image's grid: fed 0..T-1 instead, its logits part from
    the source's after the image tokens."""
    pipe = load(qwen_bundle("qwen2_vl"))
    report = parity_suite(pipe, limit=2, source=source_model(pipe.manifest, qwen_checkpoints["qwen2_vl"]))
    assert report["metrics"]["top1_agreement_pct"] == 100.0
    assert report["metrics"]["max_abs_logit_diff"] < 1e-3


def test_agreement_on_qwen2_vl_teacher_forces_the_answer_after_the_image(qwen_checkpoints, qwen_bundle, rng):
    """The source's answer appended after an image prompt: transformers' processor marks the prompt's image tokens
    (mm_token_type_ids), and the answer's must be marked text for the source's M-RoPE positions to be computed."""
    pipe = load(qwen_bundle("qwen2_vl"))
    data = [Sample(random_image(rng, int(rng.integers(40, 120)), int(rng.integers(40, 120))), "What is in it?",
                   where=f"sample {i}") for i in range(2)]
    report = agreement_suite(pipe, data=data, source=source_model(pipe.manifest, qwen_checkpoints["qwen2_vl"]),
                             max_new_tokens=6)
    assert report["metrics"]["top1_agreement_pct"] == 100.0 and report["metrics"]["mean_kl"] < 1e-6


def test_logit_metrics_a_block_of_positions_at_a_time_are_the_whole_prompts(rng, monkeypatch):
    """The suite compares a prompt's logits LOGIT_ROWS positions at a time (a whole prompt's in float64 took 11 GB at
    3,000 positions of a 152k vocabulary); its numbers are those of the whole arrays, computed here in numpy."""
    monkeypatch.setattr(parity, "LOGIT_ROWS", 7)
    ref = (rng.normal(size=(50, 300)) * 3).astype(np.float32)
    ours = ref + (rng.normal(size=ref.shape) * 0.3).astype(np.float32)
    agree, kl, max_abs = parity.logit_metrics(ours, ref)

    def log_softmax(x):
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    assert agree == int((ours.argmax(-1) == ref.argmax(-1)).sum())
    np.testing.assert_allclose(kl, (np.exp(log_softmax(ref)) * (log_softmax(ref) - log_softmax(ours))).sum(), rtol=1e-9)
    assert max_abs == float(np.abs(ours.astype(np.float64) - ref).max())
