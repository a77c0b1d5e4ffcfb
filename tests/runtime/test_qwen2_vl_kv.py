"""Qwen2-VL and Qwen2.5-VL under kv_layout static and paged decode what transformers' `generate` decodes: M-RoPE's
three rows of positions reach the shared buffers' graphs, each sequence decoding from its own rope delta while
sequences of other image sizes share the call, and a request that reuses an image's prefix (stored for static, a
live holder's blocks for paged) continues from the prefix's positions. The static cache's TensorRT form computes
what the growing cache's graph computes under M-RoPE positions (run by ONNX Runtime on the CPU)."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from builders import StaticCacheForm, decided_steps, hf_greedy, random_image
from conftest import QWEN_FAMILIES
from mmtrt.backends.tensorrt.kv_cache_form import tensorrt_form
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.runtime.qwen2_vl import mrope_positions
from mmtrt.zoo.tiny_qwen2_vl import build_tiny_qwen2_vl

NEW_TOKENS = 6
LAYOUTS = {"static": "{layout: static}", "paged": "{layout: paged, block_tokens: 4}"}
# (height, width, prompt): three image sizes (4, 20 and 6 image tokens), the first image asked twice
REQUESTS = [(64, 64, "What is in the picture?"), (112, 140, "Describe it."), (40, 160, "Name a colour."),
            (64, 64, "Count the shapes.")]


@pytest.fixture(scope="module")
def references():
    """family -> (images, [(prompt ids, generate's tokens, margins)] per request), drawn once for both layouts."""
    rng, out = np.random.default_rng(7), {}
    images = {size: random_image(rng, *size) for size in {(h, w) for h, w, _ in REQUESTS}}
    for family in QWEN_FAMILIES:
        model, processor = build_tiny_qwen2_vl(family)
        out[family] = [(images[h, w], prompt, hf_greedy(model, processor, images[h, w], prompt, NEW_TOKENS))
                       for h, w, prompt in REQUESTS]
    return out


@pytest.fixture(scope="module", params=[(f, layout) for f in QWEN_FAMILIES for layout in LAYOUTS])
def kv_bundle(request, qwen_compile):
    family, layout = request.param
    bundle = qwen_compile(family, f"passes:\n  - kv_layout: {LAYOUTS[layout]}\n", f"{family}-{layout}.bundle")
    return family, layout, bundle


def test_a_batch_of_sizes_with_a_shared_image_decodes_what_generate_decodes(kv_bundle, references):
    family, layout, bundle = kv_bundle
    pipe = load(bundle, threads=1)
    assert pipe.kv["layout"] == layout and "M-RoPE" in pipe.kv["position_ids"]
    cases = references[family]
    got = pipe.generate_batch([Request(image, prompt, NEW_TOKENS) for image, prompt, _ in cases])
    for (_, _, (ids, want, margins)), result in zip(cases, got):
        decided = decided_steps(margins)
        assert decided >= 2, f"the fixed images' references must decide their first steps: {margins}"
        assert result.prompt_tokens == len(ids)
        assert result.token_ids[:decided] == want[:decided]
    if layout == "static":  # the fourth request took the first one's stored image prefix; this one its own prompt
        assert len(pipe.prefixes.entries) == 3 + len(cases)  # each image's prefix, each prompt but its last token
        image, prompt, (_, want, margins) = cases[3]
        again = pipe.generate(image, prompt, max_new_tokens=NEW_TOKENS)
        assert again.token_ids[:decided_steps(margins)] == want[:decided_steps(margins)]


class GrowingCache:
    """The hf graph: past concatenated with the new keys and values."""

    def __init__(self, model, llm):
        self.session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        self.past = {f"past.{i}.{k}": np.zeros((1, llm["num_kv_heads"], 0, llm["head_dim"]), np.float32)
                     for i in range(llm["num_layers"]) for k in ("key", "value")}

    def step(self, embeds, positions):
        total = next(iter(self.past.values())).shape[2] + embeds.shape[1]
        names = [o.name for o in self.session.get_outputs()]
        out = dict(zip(names, self.session.run(None, {"inputs_embeds": embeds, "position_ids": positions, "logits_from": np.zeros(1, np.int64),
                                                      "attention_mask": np.ones((1, total), np.int64),
                                                      **self.past})))
        self.past = {k.replace("present.", "past."): v for k, v in out.items() if k.startswith("present.")}
        return out["logits"]


def test_the_tensorrt_form_of_the_static_cache_takes_mrope_positions(qwen_compile, qwen_bundle, rng):
    """An image prompt (positions from its grid, three rows apart), then decode steps at length + rope delta:
    the TensorRT form (its mask from the cache indices, not from position_ids) and the GroupQueryAttention form
    give the growing cache's logits."""
    static = qwen_compile("qwen2_vl", "passes:\n  - kv_layout: {layout: static}\n", "qwen2_vl-static.bundle")
    manifest = json.loads((static / "manifest.json").read_text())
    llm, capacity = manifest["model"]["llm"], manifest["dims"]["capacity"]["max"]
    gqa_model = onnx.load(static / "llm.onnx")
    forms = [GrowingCache(onnx.load(qwen_bundle("qwen2_vl") / "llm.onnx"), llm),
             StaticCacheForm(gqa_model, llm, capacity), StaticCacheForm(tensorrt_form(gqa_model), llm, capacity)]
    image_token = manifest["model"]["image_token_id"]
    ids = [5, 6] + [image_token] * 6 + [7, 8, 9]  # a 4 x 6 patch grid: 2 x 3 image tokens
    positions, delta = mrope_positions(ids, image_token, [(1, 4, 6)], 2)
    assert delta < 0 and not np.array_equal(positions[1], positions[2])
    steps = [(len(ids), positions[:, None])] + [(1, np.full((3, 1, 1), len(ids) + i + delta)) for i in range(3)]
    for seq, step_positions in steps:
        embeds = rng.normal(size=(1, seq, llm["hidden_size"])).astype(np.float32)
        want, *got = (form.step(embeds, step_positions) for form in forms)
        for logits in got:
            np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
