"""grouped_decode_attention on zoo:tiny-llava's static-layout LLM, with and without pack_qkv_rotary: over buffers
bound in place as past and present, prompts (through GroupQueryAttention), chunks of up to MAX_NEW_TOKENS and
decode steps (through the stacked MatMuls) give the logits of the GroupQueryAttention graph and of the hf bundle's
growing cache, write the same cache rows, and write nothing past them; rows of a batch at different lengths attend
each up to its own. A compiled bundle decodes transformers' greedy tokens, with speculation (its verification
steps take the stacked form) and in a batch."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from builders import StaticCacheForm, assert_same_up_to_near_ties, grown_logits, hf_greedy, random_image, static_llm_feeds
from conftest import PREFILL_RECIPE, ROOT, compile_to
from cpp_harness import generate_cpp
from mmtrt.errors import UserError
from mmtrt.ir.graph import Component, ModelIR, graph_io
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.zoo.tiny_llava import build_tiny_llava
from passes.fusion.fuse_projections import FuseProjections
from passes.kv.grouped_decode_attention import MAX_NEW_TOKENS, GroupedDecodeAttention
from passes.kv.kv_layout import KvLayout
from passes.kv.pack_qkv_rotary import PackQkvRotary

CAPACITY = 40


def _ir(model: onnx.ModelProto, config: dict) -> ModelIR:
    comp = Component("llm", graph_io(model, "inputs"), graph_io(model, "outputs"), onnx=model)
    return ModelIR({"llm": comp}, config, {})


@pytest.fixture(scope="module", params=["static", "packed"])
def forms(request, tiny_bundle):
    """(GroupQueryAttention graph, the pass's graph, its report, model config)."""
    config = json.loads((tiny_bundle / "manifest.json").read_text())["model"]
    ir = _ir(onnx.load(tiny_bundle / "llm.onnx"), config)
    KvLayout(KvLayout.Config(layout="static")).run(ir)
    if request.param == "packed":
        FuseProjections(FuseProjections.Config()).run(ir)
        PackQkvRotary(PackQkvRotary.Config()).run(ir)
    before = onnx.ModelProto.FromString(ir.components["llm"].onnx.SerializeToString())
    report = GroupedDecodeAttention(GroupedDecodeAttention.Config()).run(ir)["llm"]
    return before, ir.components["llm"].onnx, report, config


def test_every_layer_attends_in_an_if_with_the_graph_io_unchanged(forms):
    before, after, report, config = forms
    layers = config["llm"]["num_layers"]
    assert report["layers"] == layers and "skipped" not in report
    ops = [n.op_type for n in after.graph.node]
    assert ops.count("If") == layers and "GroupQueryAttention" not in ops
    assert ops.count("ScatterElements") == 2 * layers
    for field in ("input", "output"):
        assert [v.name for v in getattr(after.graph, field)] == [v.name for v in getattr(before.graph, field)]
    onnx.checker.check_model(after)


@pytest.mark.parametrize("batch, steps", [(1, [MAX_NEW_TOKENS + 3, 1, 1, MAX_NEW_TOKENS, 1, 2, 1]),
                                          (3, [6, 1, 1, 1]), (2, [MAX_NEW_TOKENS + 1, 1, 1])])
def test_steps_compute_the_gqa_graph_and_the_grown_cache_in_place(forms, tiny_bundle, batch, steps, rng):
    before, after, _, config = forms
    llm = config["llm"]
    gqa, ours = StaticCacheForm(before, llm, CAPACITY, batch), StaticCacheForm(after, llm, CAPACITY, batch)
    embeds = [rng.standard_normal((batch, seq, llm["hidden_size"])).astype(np.float32) for seq in steps]
    grown = grown_logits(onnx.load(tiny_bundle / "llm.onnx"), embeds)
    for step, (e, reference) in enumerate(zip(embeds, grown)):
        mine, theirs = ours.step(e), gqa.step(e)
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5, err_msg=f"step {step}: against GQA")
        np.testing.assert_allclose(mine, reference, rtol=1e-4, atol=1e-5, err_msg=f"step {step}: against hf")
    held = int(ours.lengths[0])
    for name in gqa.cache:
        np.testing.assert_allclose(ours.cache[name][:, :, :held], gqa.cache[name][:, :, :held], rtol=1e-4, atol=1e-5)
        assert not ours.cache[name][:, :, held:].any()


def test_it_refuses_a_graph_without_the_static_layout_or_an_llm_offered_to_tensorrt(tiny_bundle):
    config = json.loads((tiny_bundle / "manifest.json").read_text())["model"]
    ir = _ir(onnx.load(tiny_bundle / "llm.onnx"), config)
    grouped = GroupedDecodeAttention(GroupedDecodeAttention.Config())
    with pytest.raises(UserError, match="kv_layout: {layout: static}"):
        grouped.run(ir)
    KvLayout(KvLayout.Config(layout="static")).run(ir)
    ir.components["llm"].metadata["placement"] = {"targeted": True}
    with pytest.raises(UserError, match=r"partition: {llm: \[onnxruntime\]}"):
        grouped.run(ir)


def test_rows_at_different_lengths_attend_each_up_to_its_own(forms, rng):
    before, after, _, config = forms
    feeds = static_llm_feeds(rng, config["llm"], [5, 17, 2], 1, CAPACITY)
    ours, ref = (dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
                 for s in (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                           for m in (after, before)))
    np.testing.assert_allclose(ours["logits"], ref["logits"], rtol=1e-4, atol=1e-5)
    for row, length in enumerate([5, 17, 2]):  # each row's cache up to its new token, and nothing else changed
        for name in (n for n in ref if n.startswith("present.")):
            np.testing.assert_allclose(ours[name][row][:, :length + 1], ref[name][row][:, :length + 1], rtol=1e-4,
                                       atol=1e-5, err_msg=f"{name} row {row}")
            np.testing.assert_array_equal(ours[name][row][:, length + 1:],
                                          feeds[name.replace("present.", "past.")][row][:, length + 1:])


PROMPTS = ["What is in the picture?", "Describe the image in detail.", "one two three one two three one two"]


@pytest.fixture(scope="module")
def grouped_bundle(tmp_path_factory):
    passes = ("  - speculative: {draft: early_exit, layers: 2, k: 4}\n  - kv_layout: {layout: static}\n"
              "  - grouped_decode_attention: {}\n")
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace("envelope:", passes + "envelope:")
    recipe += "partition: {llm: [onnxruntime]}\n"
    return compile_to(tmp_path_factory.mktemp("tiny-grouped"), recipe, "grouped.bundle")


def test_a_bundle_decodes_transformers_tokens_with_speculation_and_in_a_batch(grouped_bundle, rng):
    model, processor = build_tiny_llava()
    pipe = load(grouped_bundle, prefix_cache_mib=0)
    images = [random_image(rng, 64, 64) for _ in PROMPTS]
    for image, prompt in zip(images, PROMPTS):
        _, tokens, margins = hf_greedy(model, processor, image, prompt, 16)
        ours = pipe.generate(image, prompt, 16)
        assert ours.speculative is not None
        assert_same_up_to_near_ties(ours, type("Ref", (), {"token_ids": tokens, "margins": margins}))
    pipe.speculative = None
    plain = [pipe.generate(image, p, 16).token_ids for image, p in zip(images, PROMPTS)]
    batch = pipe.generate_batch([Request(image, p, 16) for image, p in zip(images, PROMPTS)])
    assert [g.token_ids for g in batch] == plain


@pytest.fixture(scope="module")
def grouped_prefill_bundle(tmp_path_factory):
    """tiny_prefill_bundle's recipe with grouped_decode_attention after int8_prefill, which copied the LLM."""
    tail = ("  - int8_prefill: {min_tokens: 4, calibration: {samples: 2, text_windows: 1}}\n"
            "  - grouped_decode_attention: {}\n")
    recipe = PREFILL_RECIPE.format(tail=tail) + "partition: {llm: [onnxruntime]}\n"
    return compile_to(tmp_path_factory.mktemp("grouped-prefill"), recipe, "grouped.bundle")


def test_after_int8_prefill_both_runtimes_decode_the_gqa_bundles_tokens(grouped_prefill_bundle, tiny_prefill_bundle,
                                                                        rng, tmp_path):
    prompt_graph = onnx.load(grouped_prefill_bundle / "llm_prefill.onnx", load_external_data=False)
    assert "GroupQueryAttention" in {n.op_type for n in prompt_graph.graph.node}
    for index in range(2):
        image = tmp_path / f"image{index}.png"
        random_image(rng, int(rng.integers(24, 140)), int(rng.integers(24, 140))).save(image)
        prompt = "What is in the picture?"
        reference = load(tiny_prefill_bundle, threads=1).generate(image, prompt)
        ours = load(grouped_prefill_bundle, threads=1).generate(image, prompt)
        assert_same_up_to_near_ties(ours, reference)
        assert generate_cpp(grouped_prefill_bundle, image, prompt)["token_ids"] == ours.token_ids


def test_a_pass_after_it_on_the_llm_is_refused(tmp_path):
    tail = "  - grouped_decode_attention: {}\n  - pack_qkv_rotary: {}\n"
    with pytest.raises(UserError, match="after grouped_decode_attention, which must be the last pass"):
        compile_to(tmp_path, PREFILL_RECIPE.format(tail=tail) + "partition: {llm: [onnxruntime]}\n")
