"""channel_prune on zoo:tiny-llava (CLIP tower with biases, LLaMA with grouped-query attention).

- Channels and heads zeroed in the PyTorch model are exactly the ones pruned, by either importance, and the pruned
  graphs give the unpruned graphs' outputs (LLM: prefill and a decode step on the shrunken KV cache).
- Units removed at random (not zeroed) give the logits of a smaller transformers model built from the kept
  weights: the rewrite, not only the selection, is checked against an independent implementation.
- With bias compensation, the pruned graphs compute the unpruned graphs with the removed activations held at
  their calibration means (computed here by exposing them as outputs), vision and LLM.
- Ratio 0, and ratios that round to every unit, leave the graphs bit-identical.
- The parameter counts the report predicts are the counts of the written graph.
"""

import copy

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import helper, numpy_helper
from PIL import Image
from pydantic import ValidationError
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import compile_to
from mmtrt.ir.frontend import lower
from mmtrt.ir.rewrite import cleanup
from mmtrt.prune.groups import find_groups
from mmtrt.prune.importance import kept_count
from mmtrt.quant.calibration import calibration_batches
from mmtrt.runtime import load
from mmtrt.zoo.tiny_llava import build_tiny_llava
from passes.prune.channel_prune import ChannelPrune

VISION_HEADS, VISION_MLP = 4, 128
LLM_KV, LLM_REP, HEAD_DIM, LLM_MLP, HIDDEN = 2, 2, 32, 384, 128


def run_pass(ir, **config):
    return ChannelPrune(ChannelPrune.Config.model_validate(config)).run(ir)


def session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def vision_out(model, pixels):
    return session(model).run(None, {"pixel_values": pixels})[0]


def llm_steps(model, embeds, kv_heads):
    """Logits of a prefill of `embeds` and of one decode step fed the prefill's present cache."""
    sess = session(model)
    batch, seq = embeds.shape[:2]
    layers = sum(i.name.endswith(".key") for i in sess.get_inputs())
    cache = {f"past.{i}.{kind}": np.zeros((batch, kv_heads, 0, HEAD_DIM), np.float32)
             for i in range(layers) for kind in ("key", "value")}
    names = [o.name for o in sess.get_outputs()]
    feeds = {"inputs_embeds": embeds, "attention_mask": np.ones((batch, seq), np.int64),
             "position_ids": np.tile(np.arange(seq), (batch, 1)), "logits_from": np.zeros(1, np.int64), **cache}
    out = dict(zip(names, sess.run(None, feeds)))
    cache = {k.replace("present.", "past."): v for k, v in out.items() if k.startswith("present.")}
    step = {"inputs_embeds": embeds[:, -1:], "attention_mask": np.ones((batch, seq + 1), np.int64),
            "position_ids": np.full((batch, 1), seq), "logits_from": np.zeros(1, np.int64), **cache}
    return out["logits"], sess.run(["logits"], step)[0]


def block_rows(units, width):
    """The rows of the given units when each unit owns `width` consecutive rows."""
    return np.concatenate([np.arange(u * width, (u + 1) * width) for u in units])


def zero_units(model, chosen):
    """Zero, in the PyTorch model, every weight of the chosen units: vision MLP channels and heads, LLM MLP
    channels and KV groups (with their query heads), per layer."""
    tower, lm = model.model.vision_tower.encoder.layers, model.model.language_model.layers
    with torch.no_grad():
        for layer, units in chosen["vision_mlp"].items():
            mlp = tower[layer].mlp
            mlp.fc1.weight[units] = 0
            mlp.fc1.bias[units] = 0
            mlp.fc2.weight[:, units] = 0
        for layer, heads in chosen["vision_heads"].items():
            attn = tower[layer].self_attn
            rows = block_rows(heads, 16)
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                proj.weight[rows] = 0
                proj.bias[rows] = 0
            attn.out_proj.weight[:, rows] = 0
        for layer, units in chosen["llm_mlp"].items():
            mlp = lm[layer].mlp
            mlp.gate_proj.weight[units] = 0
            mlp.up_proj.weight[units] = 0
            mlp.down_proj.weight[:, units] = 0
        for layer, groups in chosen["llm_kv"].items():
            attn = lm[layer].self_attn
            kv_rows, q_rows = block_rows(groups, HEAD_DIM), block_rows(groups, LLM_REP * HEAD_DIM)
            attn.k_proj.weight[kv_rows] = 0
            attn.v_proj.weight[kv_rows] = 0
            attn.q_proj.weight[q_rows] = 0
            attn.o_proj.weight[:, q_rows] = 0


@pytest.fixture(scope="module")
def lowered(tiny):
    return lower(*tiny)


@pytest.fixture(scope="module")
def zeroed():
    """tiny-llava with units drawn afresh zeroed, lowered once for both importances."""
    rng = np.random.default_rng(np.random.SeedSequence().entropy)
    model, processor = build_tiny_llava()
    chosen = {"vision_mlp": draw(rng, VISION_MLP, 32, 4), "vision_heads": draw(rng, VISION_HEADS, 2, 4),
              "llm_mlp": draw(rng, LLM_MLP, 96, 4), "llm_kv": draw(rng, LLM_KV, 1, 4)}
    zero_units(model, chosen)
    return chosen, lower(model, processor)


def removed(report, component, kind):
    key = {"mlp": "channels_before", "heads": "heads_before", "kv": "kv_groups_before"}[kind]
    return {int(entry["layer"].split(".")[2]): entry["removed"] for entry in report[component]["layers"] if key in entry}


def draw(rng, units, count, layers):
    return {layer: sorted(rng.choice(units, count, replace=False).tolist()) for layer in range(layers)}


@pytest.mark.parametrize("importance", ["l2", "activation"])
def test_zeroed_units_are_the_ones_pruned_and_outputs_do_not_change(zeroed, rng, importance):
    chosen, ir = zeroed[0], copy.deepcopy(zeroed[1])
    before = {name: copy.deepcopy(ir.components[name].onnx) for name in ("vision", "llm")}
    report = run_pass(ir, vision={"mlp": 0.25, "heads": 0.5}, llm={"mlp": 0.25, "heads": 0.5}, importance=importance,
                      calibration={"samples": 4, "text_windows": 1})
    assert removed(report, "vision", "mlp") == chosen["vision_mlp"]
    assert removed(report, "vision", "heads") == chosen["vision_heads"]
    assert removed(report, "llm", "mlp") == chosen["llm_mlp"]
    assert removed(report, "llm", "kv") == chosen["llm_kv"]

    pixels = rng.normal(size=(2, 3, 64, 64)).astype(np.float32)
    np.testing.assert_allclose(vision_out(ir.components["vision"].onnx, pixels), vision_out(before["vision"], pixels),
                               rtol=1e-4, atol=1e-4)
    embeds = rng.normal(size=(2, 7, HIDDEN)).astype(np.float32)
    for got, want in zip(llm_steps(ir.components["llm"].onnx, embeds, 1), llm_steps(before["llm"], embeds, LLM_KV)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert ir.config["llm"]["num_kv_heads"] == 1 and ir.config["llm"]["num_heads"] == 2
    assert [s.shape for s in ir.components["llm"].inputs if s.name == "past.0.key"] == [("batch", 1, "past", HEAD_DIM)]


def test_llm_pruned_by_l2_matches_a_smaller_transformers_model(tiny, lowered, rng):
    """No zeroed units: the kept rows and columns, copied into a LlamaForCausalLM of the pruned sizes, must give
    the pruned graph's logits on fresh random embeddings."""
    model, ir = tiny[0], copy.deepcopy(lowered)
    report = run_pass(ir, llm={"mlp": 0.5, "heads": 0.5}, importance="l2", bias_compensation=False)
    kept_mlp = {layer: np.setdiff1d(np.arange(LLM_MLP), r) for layer, r in removed(report, "llm", "mlp").items()}
    kept_kv = {layer: np.setdiff1d(np.arange(LLM_KV), r) for layer, r in removed(report, "llm", "kv").items()}
    source = model.model.language_model
    config = LlamaConfig(**{**model.config.text_config.to_dict(), "intermediate_size": 192, "num_key_value_heads": 1,
                            "num_attention_heads": LLM_REP, "head_dim": HEAD_DIM})
    small = LlamaForCausalLM(config).eval()
    state = {k: v.clone() for k, v in source.state_dict().items()}
    for layer in range(4):
        p = f"layers.{layer}."
        ch = torch.as_tensor(kept_mlp[layer])
        for name in ("gate_proj", "up_proj"):
            state[p + f"mlp.{name}.weight"] = state[p + f"mlp.{name}.weight"][ch]
        state[p + "mlp.down_proj.weight"] = state[p + "mlp.down_proj.weight"][:, ch]
        kv = torch.as_tensor(block_rows(kept_kv[layer], HEAD_DIM))
        q = torch.as_tensor(block_rows(kept_kv[layer], LLM_REP * HEAD_DIM))
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            state[p + f"self_attn.{name}.weight"] = state[p + f"self_attn.{name}.weight"][rows]
        state[p + "self_attn.o_proj.weight"] = state[p + "self_attn.o_proj.weight"][:, q]
    small.model.load_state_dict(state)
    small.lm_head.load_state_dict(model.lm_head.state_dict())
    embeds = rng.normal(size=(2, 9, HIDDEN)).astype(np.float32)
    with torch.no_grad():
        expected = small(inputs_embeds=torch.from_numpy(embeds)).logits.numpy()
    got, _ = llm_steps(ir.components["llm"].onnx, embeds, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def with_means_in_place(model, groups, removed_units, means):
    """The unpruned graph with each removed unit's activations replaced by their calibration means: what pruning
    with bias compensation must compute."""
    model = copy.deepcopy(model)
    for g in groups:
        mask = np.ones(g.units * g.activation_width, np.float32)
        for unit in removed_units[g.label]:
            mask[unit * g.activation_width:(unit + 1) * g.activation_width] = 0
        fill = ((1 - mask) * means[g.label]).astype(np.float32)
        names = [f"{g.label}.{suffix}" for suffix in ("mask", "fill", "masked", "filled")]
        for node in model.graph.node:
            node.input[:] = [names[3] if n == g.activation else n for n in node.input]
        model.graph.node.extend([helper.make_node("Mul", [g.activation, names[0]], [names[2]]),
                                 helper.make_node("Add", [names[2], names[1]], [names[3]])])
        model.graph.initializer.extend([numpy_helper.from_array(mask, names[0]), numpy_helper.from_array(fill, names[1])])
    return cleanup(model)


def calibration_means(model, groups, feeds_list):
    """Mean of every activation entry over all calibration tokens, by exposing the tensors as graph outputs."""
    model = copy.deepcopy(model)
    model.graph.output.extend(helper.make_empty_tensor_value_info(g.activation) for g in groups)
    sess = session(model)
    sums, tokens = {g.label: 0.0 for g in groups}, 0
    for feeds in feeds_list:
        outs = sess.run([g.activation for g in groups], feeds)
        for g, x in zip(groups, outs):
            sums[g.label] = sums[g.label] + x.reshape(-1, x.shape[-1]).astype(np.float64).sum(axis=0)
        tokens += int(np.prod(outs[0].shape[:-1]))
    return {label: total / tokens for label, total in sums.items()}


def test_bias_compensation_equals_removed_activations_held_at_their_means(lowered, rng):
    """Vision (whose fc2 and out_proj have biases) and LLM (whose down_proj and o_proj get a new one)."""
    ir = copy.deepcopy(lowered)
    before = {name: copy.deepcopy(ir.components[name].onnx) for name in ("vision", "llm")}
    batches = calibration_batches(ir, "digits", 4, 1)
    ratios = {"mlp": 0.5, "heads": 0.5}
    report = run_pass(ir, vision=ratios, llm=ratios, calibration={"samples": 4, "text_windows": 1})
    pixels = rng.normal(size=(2, 3, 64, 64)).astype(np.float32)
    embeds = rng.normal(size=(2, 7, HIDDEN)).astype(np.float32)
    for name, feeds in (("vision", batches.vision), ("llm", batches.llm)):
        groups = find_groups(before[name], name)
        removed_units = {entry["layer"]: entry["removed"] for entry in report[name]["layers"]}
        assert all(removed_units.values())
        reference = with_means_in_place(before[name], groups, removed_units,
                                        calibration_means(before[name], groups, feeds))
        if name == "vision":
            np.testing.assert_allclose(vision_out(ir.components[name].onnx, pixels), vision_out(reference, pixels),
                                       rtol=1e-4, atol=1e-4)
        else:
            for got, want in zip(llm_steps(ir.components[name].onnx, embeds, 1), llm_steps(reference, embeds, LLM_KV)):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_ratios_that_keep_every_unit_leave_graphs_bit_identical(lowered):
    ir = copy.deepcopy(lowered)
    before = {name: ir.components[name].onnx.SerializeToString() for name in ("vision", "llm")}
    assert run_pass(ir)["graph_changed"] is False
    report = run_pass(ir, vision={"heads": 0.1}, llm={"mlp": 0.01})  # round to 4 of 4 heads, 384 of 384 channels
    assert all(entry["removed"] == [] for c in ("vision", "llm") for entry in report[c]["layers"])
    assert {name: ir.components[name].onnx.SerializeToString() for name in ("vision", "llm")} == before


def test_predicted_parameter_counts_are_the_written_ones(lowered):
    ir = copy.deepcopy(lowered)
    report = run_pass(ir, vision={"mlp": 0.5, "heads": 0.25}, llm={"mlp": 0.3})
    for name in ("vision", "llm"):
        r = report[name]
        floats = sum(int(np.prod(t.dims)) for t in ir.components[name].onnx.graph.initializer if t.data_type == 1)
        assert r["params_after"] == floats
        assert r["params_removed_predicted"] == r["params_before"] - floats
        assert 0 < r["flops_after"] < r["flops_before"]
    # hand count for the LLM: 4 layers x 112 channels x (gate + up + down) x hidden, 384 * 0.7 -> 272 (multiple of 8),
    # less the bias compensation gives each down_proj
    assert report["llm"]["params_removed"] == 4 * ((LLM_MLP - 272) * 3 * HIDDEN - HIDDEN)


def test_kept_counts_round_to_the_multiple_and_keep_one_head():
    assert kept_count(1536, 0.3, "mlp", 8) == 1072
    assert kept_count(1536, 0.0, "mlp", 8) == 1536
    assert kept_count(12, 0.99, "mlp", 8) == 8
    assert kept_count(3, 0.9, "heads", 1) == 1
    assert kept_count(6, 0.5, "heads", 1) == 3


@pytest.mark.parametrize("config, message", [
    ({"vision": {"mlp": 1.0}}, "less than 1"),
    ({"llm": {"channels": 0.2}}, "Extra inputs"),
    ({"vision": {"mlp": 0.2}, "calibration": {"samples": 0}}, "needs calibration"),
    ({"llm": {"mlp": 0.2}, "calibration": {"samples": 0, "text_windows": 0}}, "bias_compensation: false"),
])
def test_bad_config_is_refused(config, message):
    with pytest.raises(ValidationError, match=message):
        ChannelPrune.Config.model_validate(config)


def test_pruned_bundle_generates_on_its_smaller_kv_cache(tmp_path, rng):
    recipe = """model: {source: zoo, name: tiny-llava}
passes:
  - dead_layer_elimination: {}
  - channel_prune: {vision: {mlp: 0.25}, llm: {mlp: 0.25, heads: 0.5}}
partition: {llm: [onnxruntime], vision: [onnxruntime]}
envelope: {batch: {min: 1, opt: 1, max: 1}, prompt_tokens: {min: 1, opt: 16, max: 64}, max_new_tokens: 8}
"""
    bundle = compile_to(tmp_path, recipe)
    pipe = load(bundle)
    image = Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    result = pipe.generate(image, "What is this?", max_new_tokens=4)
    assert 1 <= len(result.token_ids) <= 4
    assert pipe.model["llm"]["num_kv_heads"] == 1
