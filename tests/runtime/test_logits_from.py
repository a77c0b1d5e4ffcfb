"""The hf layout's LLM runs its lm_head from `logits_from` on: a prefill's last position equals that position
among every position's logits, and a bundle compiled before the graph took the input loads and decodes the same
tokens."""

import json
import shutil

import numpy as np
import onnx

from builders import random_image
from mmtrt.bundle.manifest import sha256_file
from mmtrt.ir.logits import without_logits_from
from mmtrt.runtime import load


def test_the_last_position_alone_equals_it_among_every_position(tiny_bundle, rng):
    pipe = load(tiny_bundle, prefix_cache_mib=0, encoder_cache_mib=0)
    embeds = rng.normal(size=(1, 9, pipe.model["llm"]["hidden_size"])).astype(np.float32)
    every, _ = pipe.step(embeds, pipe.empty_cache())
    last, cache = pipe.step(embeds, pipe.empty_cache(), last_only=True)
    assert every.shape[1] == 9 and last.shape[1] == 1
    np.testing.assert_allclose(last[:, 0], every[:, -1], rtol=0, atol=1e-5)
    assert next(iter(cache.values())).shape[2] == 9  # the cache holds every position all the same


def test_a_bundle_from_before_logits_from_decodes_the_same_tokens(tiny_bundle, tmp_path, rng):
    old = tmp_path / "old.bundle"
    shutil.copytree(tiny_bundle, old)
    model = onnx.load(old / "llm.onnx", load_external_data=False)
    without_logits_from(model.graph)
    onnx.save(model, old / "llm.onnx")
    manifest = json.loads((old / "manifest.json").read_text())
    llm = manifest["components"]["llm"]
    assert "logits_from" in {t["name"] for t in llm["inputs"]}
    llm["inputs"] = [t for t in llm["inputs"] if t["name"] != "logits_from"]
    llm["outputs"][0]["shape"][1] = "seq"
    manifest["artifacts"]["llm.onnx"] = sha256_file(old / "llm.onnx")
    (old / "manifest.json").write_text(json.dumps(manifest))
    image = random_image(rng, 40, 60)
    before = load(old, prefix_cache_mib=0, encoder_cache_mib=0)
    assert not before.hf.logits_from
    want = load(tiny_bundle, prefix_cache_mib=0, encoder_cache_mib=0).generate(image, "what is it?", 8)
    assert before.generate(image, "what is it?", 8).token_ids == want.token_ids
