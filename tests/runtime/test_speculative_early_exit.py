"""The early-exit draft: the LLM's first K layers cut from its graph (with an exit adapter on hf and paged) compute
what the source model's first K layers, the adapter's map, final norm and lm_head compute (PyTorch eager), its layers'
weights are the LLM's in the bundle, and speculation with it gives plain decoding's greedy tokens on every KV
layout."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from transformers import AutoTokenizer

from builders import random_image
from conftest import ROOT, compile_to
from mmtrt.eval.suites import reference_text
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request

LAYERS = 2
ADAPTER = "adapter: {steps: 8, batch_tokens: 64, data: {text_windows: 2, heldout_windows: 1}}"
PROMPTS = ["What is in the picture?", "Describe the image in detail.", "one two three one two three one two"]


@pytest.fixture(scope="module", params=["hf", "static", "paged"])
def early_exit_bundle(request, tmp_path_factory):
    kv = "" if request.param == "hf" else f"  - kv_layout: {{layout: {request.param}}}\n"
    adapter = "" if request.param == "static" else f", {ADAPTER}"
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace(
        "envelope:", f"  - speculative: {{draft: early_exit, layers: {LAYERS}, k: 4{adapter}}}\n{kv}envelope:")
    return compile_to(tmp_path_factory.mktemp(f"tiny-early-exit-{request.param}"), recipe, "early.bundle")


def test_greedy_tokens_equal_plain_decoding(early_exit_bundle, rng):
    pipe = load(early_exit_bundle, prefix_cache_mib=0)
    config = pipe.speculative
    assert config == {"draft": "early_exit", "k": 4, "layers": LAYERS, "component": "draft"}
    accepted = 0
    for _ in range(3):  # the random model's first layers agree with the whole on few images; any try must accept
        images = [random_image(rng, 64, 64) for _ in PROMPTS]
        pipe.speculative = None
        plain = [pipe.generate(image, p, 24).token_ids for image, p in zip(images, PROMPTS)]
        pipe.speculative = config
        spec = [pipe.generate(image, p, 24) for image, p in zip(images, PROMPTS)]
        assert [g.token_ids for g in spec] == plain
        accepted = sum(g.speculative["accepted"] for g in spec)
        if accepted:
            break
    assert accepted > 0
    batch = pipe.generate_batch([Request(image, p, 24) for image, p in zip(images, PROMPTS)])
    assert [g.token_ids for g in batch] == plain


def test_the_draft_reads_the_llms_weights_from_its_external_data(early_exit_bundle):
    manifest = load(early_exit_bundle).manifest
    files = manifest["components"]["draft"]["files"]
    assert "llm.onnx.data" in files
    draft = onnx.load(early_exit_bundle / "draft.onnx", load_external_data=False)
    external = [t for t in draft.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
                and not t.name.startswith("speculative.adapter.")]
    assert external and all(dict((e.key, e.value) for e in t.external_data)["location"] == "llm.onnx.data"
                            for t in external)
    own = early_exit_bundle / "draft.onnx.data"
    adapter = adapter_weights(early_exit_bundle)
    own_bytes, adapter_bytes = own.stat().st_size if own.exists() else 0, sum(a.nbytes for a in adapter or ())
    assert own_bytes <= adapter_bytes + 0.05 * (early_exit_bundle / "llm.onnx.data").stat().st_size


def test_the_draft_computes_the_source_models_first_layers(tiny, early_exit_bundle, rng):
    """Against transformers: the tiny LLaVA's language model with its first K layers only, on random embeddings
    after a cache of those layers."""
    model, _ = tiny
    lm = model.model.language_model if hasattr(model.model, "language_model") else model.language_model.model
    config = lm.config
    heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    past_len, seq = 5, 3
    embeds = rng.standard_normal((1, past_len + seq, config.hidden_size)).astype(np.float32)
    kept = torch.nn.ModuleList(list(lm.layers)[:LAYERS])
    full_layers, lm.layers, norm = lm.layers, kept, lm.norm
    adapter = adapter_weights(early_exit_bundle)
    if adapter is not None:  # the map between the K-th layer's output and the final norm
        lm.norm = torch.nn.Sequential(Mapped(*adapter), norm)
    try:
        with torch.no_grad():
            out = lm(inputs_embeds=torch.from_numpy(embeds), use_cache=True)
            expected = model.lm_head(out.last_hidden_state).numpy()[:, past_len:]
    finally:
        lm.layers, lm.norm = full_layers, norm
    cache = out.past_key_values
    feeds = {"inputs_embeds": embeds[:, past_len:], "attention_mask": np.ones((1, past_len + seq), np.int64),
             "position_ids": np.arange(past_len, past_len + seq, dtype=np.int64)[None]}
    for i in range(LAYERS):
        key, value = (cache.layers[i].keys, cache.layers[i].values) if hasattr(cache, "layers") else cache[i]
        feeds[f"past.{i}.key"] = key[:, :, :past_len].numpy()
        feeds[f"past.{i}.value"] = value[:, :, :past_len].numpy()
        assert feeds[f"past.{i}.key"].shape == (1, heads, past_len, dim)
    session = ort.InferenceSession(str(early_exit_bundle / "draft.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], feeds)[0]
    np.testing.assert_allclose(logits, expected, atol=1e-4 * np.abs(expected).max())


class Mapped(torch.nn.Module):
    def __init__(self, weight, bias):
        super().__init__()
        self.weight, self.bias = torch.tensor(weight), torch.tensor(bias)

    def forward(self, h):
        return h @ self.weight + self.bias


def adapter_weights(bundle):
    """The exit adapter's (weight, bias) in the bundle's draft, None without one."""
    draft = onnx.load(bundle / "draft.onnx")
    arrays = {t.name: onnx.numpy_helper.to_array(t) for t in draft.graph.initializer}
    if "speculative.adapter.weight" not in arrays:
        return None
    return arrays["speculative.adapter.weight"], arrays["speculative.adapter.bias"]


def test_the_adapters_heldout_agreement_is_what_the_source_model_gives_with_it(tiny, early_exit_bundle):
    """The pass reports the draft's top-1 agreement with the full model on the reference text's first window; the
    source model (transformers) cut to its first K layers, with the bundle's adapter, agrees with itself as often."""
    report = next(p for p in load(early_exit_bundle).manifest["passes"] if p["pass"] == "speculative")["changes"]
    adapter = adapter_weights(early_exit_bundle)
    if adapter is None:
        assert "adapter" not in report["llm"]
        return
    heldout = report["llm"]["adapter"]["heldout"]
    assert heldout["positions"] == 512 and report["llm"]["adapter"]["trained_on"]["positions"] == 2 * 512
    ids = AutoTokenizer.from_pretrained(early_exit_bundle / "tokenizer")(
        reference_text(), add_special_tokens=False)["input_ids"][:512]
    model, _ = tiny
    lm = model.model.language_model if hasattr(model.model, "language_model") else model.language_model.model
    with torch.no_grad():
        out = lm(input_ids=torch.tensor([ids]), output_hidden_states=True)
        full = model.lm_head(out.last_hidden_state).argmax(-1)
        hidden = out.hidden_states  # [0]: the embeddings, [i]: the output of layer i
        drafted = model.lm_head(lm.norm(Mapped(*adapter)(hidden[LAYERS]))).argmax(-1)
    assert abs(float((drafted == full).float().mean()) - heldout["with_adapter"]["top1_agreement"]) <= 2 / 512
    assert heldout["with_adapter"]["kl"] < heldout["without_adapter"]["kl"]
