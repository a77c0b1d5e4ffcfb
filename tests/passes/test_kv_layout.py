"""kv_layout: the rewritten LLM graph computes what the exporter's growing-cache graph computes, in shared buffers."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import compile_to
from mmtrt.cli import main
from mmtrt.errors import UserError
from mmtrt.ir.graph import ModelIR
from passes.kv.kv_layout import KvLayout

RECIPE = """model: {source: hf, path: checkpoint}
passes:
  - dead_layer_elimination: {}
  - kv_layout: {layout: static}
envelope:
  batch: {min: 1, opt: 1, max: 2}
  prompt_tokens: {min: 1, opt: 16, max: 40}
  max_new_tokens: 9
"""


@pytest.fixture(scope="module")
def static_bundle(siglip_checkpoint):
    return compile_to(siglip_checkpoint.parent, RECIPE, "pass-static.bundle")


def session(bundle):
    return ort.InferenceSession(str(bundle / "llm.onnx"), providers=["CPUExecutionProvider"])


def test_every_layer_attends_through_group_query_attention_on_the_buffers(static_bundle):
    manifest = json.loads((static_bundle / "manifest.json").read_text())
    llm = manifest["model"]["llm"]
    graph = onnx.load(static_bundle / "llm.onnx").graph
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == llm["num_layers"]
    assert not any(n.op_type in ("Attention", "Concat") for n in graph.node)
    for i, node in enumerate(gqa):
        assert list(node.input[3:7]) == [f"past.{i}.key", f"past.{i}.value", "seqlens_k", "total_sequence_length"]
        assert list(node.output[1:]) == [f"present.{i}.key", f"present.{i}.value"]
    spec = next(s for s in manifest["components"]["llm"]["inputs"] if s["name"] == "past.0.key")
    assert spec["shape"] == ["batch", llm["num_kv_heads"], "capacity", llm["head_dim"]]
    assert "attention_mask" not in {s["name"] for s in manifest["components"]["llm"]["inputs"]}


def test_manifest_records_the_layout_and_the_capacity_of_the_envelope(static_bundle):
    manifest = json.loads((static_bundle / "manifest.json").read_text())
    kv = manifest["model"]["kv_cache"]
    assert (kv["layout"], kv["dtype"], kv["past_present_share_buffer"]) == ("static", "float32", True)
    capacity = 40 + manifest["model"]["vision"]["image_tokens"] + 9
    assert manifest["dims"]["capacity"] == {"min": capacity, "opt": capacity, "max": capacity}
    assert manifest["profiles"]["llm"]["past.0.key"]["max"][2] == capacity


def test_polygraphy_gets_no_generic_loader_for_a_layout_cache_and_says_why(static_bundle):
    loaders = json.loads((static_bundle / "manifest.json").read_text())["polygraphy"]
    assert loaders["llm"]["data_loader"] is None and "capacity" in loaders["llm"]["why"]
    assert (static_bundle / loaders["vision"]["data_loader"]).is_file()


def _hf_call(sess, embeds, past_len, past):
    batch, seq = embeds.shape[:2]
    feeds = {"inputs_embeds": embeds, "attention_mask": np.ones((batch, past_len + seq), np.int64),
             "position_ids": np.tile(np.arange(past_len, past_len + seq), (batch, 1)),
             "logits_from": np.zeros(1, np.int64), **past}
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def test_prefill_then_decode_in_place_equals_the_growing_cache(static_bundle, siglip_bundle, rng):
    """Random embeddings through both graphs: logits equal at every position, and the buffers hold the cache."""
    hf, static = session(siglip_bundle), session(static_bundle)
    manifest = json.loads((static_bundle / "manifest.json").read_text())
    llm, capacity = manifest["model"]["llm"], manifest["dims"]["capacity"]["max"]
    hidden, kv_shape = llm["hidden_size"], (1, llm["num_kv_heads"], 0, llm["head_dim"])
    names = [i.name for i in static.get_inputs() if i.name.startswith("past.")]
    past = {n: np.zeros(kv_shape, np.float32) for n in names}
    buffers = {n: np.zeros((1, kv_shape[1], capacity, kv_shape[3]), np.float32) for n in names}
    length = 0
    for seq in (7, 1, 1, 3):
        embeds = rng.standard_normal((1, seq, hidden)).astype(np.float32)
        ref = _hf_call(hf, embeds, length, past)
        past = {n: ref[n.replace("past.", "present.")] for n in names}
        for logits_from, expect in ((0, ref["logits"]), (seq - 1, ref["logits"][:, -1:])):
            io = static.io_binding()
            for name, value in (("inputs_embeds", embeds), ("position_ids", np.arange(length, length + seq)[None]),
                                ("seqlens_k", np.array([length + seq - 1], np.int32)),
                                ("total_sequence_length", np.array(length + seq, np.int32)),
                                ("logits_from", np.array([logits_from]))):
                io.bind_cpu_input(name, value)
            io.bind_output("logits")
            for n in names:
                value = ort.OrtValue.ortvalue_from_numpy(buffers[n])
                io.bind_ortvalue_input(n, value)
                io.bind_ortvalue_output(n.replace("past.", "present."), value)
            static.run_with_iobinding(io)
            np.testing.assert_allclose(io.get_outputs()[0].numpy(), expect, atol=1e-4, rtol=0)
        length += seq
        for n in names:
            np.testing.assert_allclose(buffers[n][:, :, :length], past[n], atol=1e-5, rtol=0)
            assert not buffers[n][:, :, length:].any()


def test_plan_shows_the_layout_before_export(siglip_checkpoint, capsys):
    recipe = siglip_checkpoint.parent / "plan.yaml"
    recipe.write_text(RECIPE)
    assert main(["compile", str(recipe), "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dims_after_passes"]["capacity"]["max"] == 40 + plan["image_tokens_after_passes"] + 9
    assert "capacity" not in plan["dims_before_passes"]


def test_a_graph_without_the_exporter_attention_is_refused(static_bundle):
    model = onnx.load(static_bundle / "llm.onnx")
    ir = ModelIR({}, {"llm": {"num_layers": 3}}, {})
    ir.components["llm"] = type("C", (), {"onnx": model})()
    with pytest.raises(UserError, match="found 0 Attention nodes for 3 layers"):
        KvLayout(KvLayout.Config()).run(ir)


def test_paged_plan_sizes_the_pool_and_the_trtllm_build_options(siglip_checkpoint):
    from mmtrt.handoff.trtllm_plan import trtllm_plan
    from mmtrt.compiler import make_plan
    from mmtrt.partition.shapes import plan_dims

    recipe = siglip_checkpoint.parent / "paged.yaml"
    recipe.write_text(RECIPE.replace("layout: static", "layout: paged, block_tokens: 32"))
    plan = make_plan(recipe)
    dims = plan_dims(plan.passes.facts_after, plan.recipe.envelope)
    capacity = 40 + plan.passes.facts_after["vision"]["image_tokens"] + 9
    blocks = 2 * -(-capacity // 32)  # the envelope's batch of 2 at full capacity
    assert dims["pool_blocks"]["max"] == blocks and dims["num_slots"]["max"] == blocks * 32
    assert dims["max_blocks"]["max"] == -(-capacity // 32)
    out = trtllm_plan(plan.passes.facts_after, dims, has_checkpoint=False)
    assert "--kv_cache_type paged --tokens_per_block 32" in out["command"]
    assert out["runtime"]["max_tokens_in_paged_kv_cache"] == blocks * 32


def test_block_tokens_must_be_a_power_of_two(siglip_checkpoint, capsys):
    recipe = siglip_checkpoint.parent / "bad.yaml"
    recipe.write_text(RECIPE.replace("layout: static", "layout: paged, block_tokens: 24"))
    assert main(["compile", str(recipe), "--plan"]) == 2
    assert "block_tokens 24 is not a power of two" in capsys.readouterr().err


@pytest.mark.parametrize("layout", ["static", "paged"])
def test_an_fp16_cache_is_stored_in_fp16_and_keeps_the_logits(siglip_checkpoint, siglip_bundle, layout, rng):
    from builders import random_image
    from mmtrt.runtime import load

    recipe = RECIPE.replace("layout: static", f"layout: {layout}, cache_dtype: fp16")
    half = load(compile_to(siglip_checkpoint.parent, recipe, f"{layout}16.bundle"))
    assert half.model["kv_cache"]["dtype"] == "float16"
    assert all(a.dtype == np.float16 for a in half.stepper.cache.host.values())
    full = load(siglip_bundle)
    image = random_image(rng, 50, 70)
    logits = []
    for pipe in (half, full):
        ids = np.array([pipe.prompt_ids("What is it?")], np.int64)
        embeds = pipe.embed(ids, pipe.image_features(pipe.pixel_values(image)))
        first, cache = pipe.step(embeds, pipe.empty_cache())
        then, _ = pipe.step(pipe.embed(np.array([[int(first[0, -1].argmax())]])), cache)
        logits.append(np.concatenate([first[0], then[0]]))
    # fp16 keys and values carry a relative rounding error of 2**-11; the logits move by far less than their spread
    assert 0 < np.abs(logits[0] - logits[1]).max() < 1e-2 * np.abs(logits[1]).max()
