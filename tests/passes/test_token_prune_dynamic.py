"""token_prune's dynamic budget and attention_entropy: known answers, ONNX Runtime against numpy, and the runtime
expanding each image's placeholder to its own count, alone and in a batch."""

import copy
import json

import numpy as np
import onnx
import pytest
from onnx import helper

from builders import assert_same_up_to_near_ties, make_model, random_image, tensor
from conftest import compile_to
from mmtrt.cli import main
from mmtrt.errors import UserError
from mmtrt.ir.frontend import lower
from mmtrt.partition.placement import place_component
from mmtrt.pipeline.instruments import verify_ir
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from passes.vision import token_criteria as tc
from passes.vision import token_prune as tp
from token_prune_graphs import (GRID, HEADS, HEAD_DIM, channel_mean_saliency, dynamic_tiny_recipe, one_layer_tower,
                                prune, run, softmax)

TOKENS, DIM = 12, 3


def dynamic_selection(mass, least, most):
    """token_prune's dynamic selection alone, on given scores [n, tokens] and features [n, tokens, dim]."""
    model = make_model([], [tensor("scores", ["n", TOKENS]), tensor("features", ["n", TOKENS, DIM])],
                       [tensor("block", ["n", most, DIM]), helper.make_tensor_value_info("count", 7, ["n"])])
    b = tc.Builder(model.graph)
    block, count = tp._select_dynamic(b, "features", "scores", tp.Budget(TOKENS, most, 0, 0, 0, False, mass, least))
    model.graph.node.extend([helper.make_node("Identity", [block], ["block"]),
                             helper.make_node("Identity", [count], ["count"])])
    return model


# distinct integer scores, total 100, whose top k sum to exactly 90 and top k - 1 to less
SCORES = {3: [40, 30, 20, 2, 1, 1, 1, 1, 1, 1, 1, 1], 7: [21, 17, 14, 12, 10, 9, 7, 4, 3, 1, 1, 1]}


@pytest.mark.parametrize("least,most,expect", [(1, TOKENS, (3, 7)), (4, TOKENS, (4, 7)), (1, 5, (3, 5))])
def test_the_mass_reached_at_exactly_k_tokens_keeps_exactly_those_k(rng, least, most, expect):
    """Shuffled scores: the kept tokens are the top `count` (clamped to [least, most]) in spatial order."""
    scores = np.stack([rng.permutation(np.array(SCORES[k], np.float32)) for k in (3, 7)])
    features = rng.normal(size=(2, TOKENS, DIM)).astype(np.float32)
    block, count = run(dynamic_selection(0.9, least, most), {"scores": scores, "features": features})
    assert count.tolist() == list(expect) and block.shape == (2, most, DIM)
    for image, kept in enumerate(expect):
        top = np.sort(np.argsort(-scores[image])[:kept])
        np.testing.assert_array_equal(block[image, :kept], features[image, top])


def entropy_reference(q, k, cls):
    """numpy: log(S) minus the entropy of each patch's attention row, mean over heads."""
    p = softmax(np.einsum("nhqd,nhkd->nhqk", q.astype(np.float64), k) / np.sqrt(q.shape[-1]))[:, :, cls:]
    return (np.log(p.shape[-1]) + (p * np.log(p)).sum(-1)).mean(1)


def test_attention_entropy_keeps_the_patches_whose_attention_is_sharpest(rng):
    ir = one_layer_tower(rng)
    q = 0.01 * rng.normal(size=(2, HEADS, GRID + 1, HEAD_DIM)).astype(np.float32)
    k = rng.normal(size=q.shape).astype(np.float32)
    chosen = [np.sort(rng.choice(GRID, 4, replace=False)) for _ in range(2)]
    for image, patches in enumerate(chosen):
        for patch, strength in zip(patches, [30, 60, 40, 50]):  # a large query: a near one-hot attention row
            q[image, :, 1 + patch] = strength * k[image, :, 0] / np.sum(k[image, :, 0] ** 2, -1, keepdims=True)
    feeds = {"q": q, "k": k, "v": rng.normal(size=q.shape).astype(np.float32)}
    before = run(ir.components["vision"].onnx, feeds)[0]
    prune(ir, keep=4, method="attention_entropy")
    after = run(ir.components["vision"].onnx, feeds)[0]
    for image in range(2):
        assert np.argsort(-entropy_reference(q, k, 1)[image])[:4].tolist() == \
            sorted(chosen[image], key=lambda p: -entropy_reference(q, k, 1)[image][p])
        np.testing.assert_allclose(after[image], before[image, chosen[image]], rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def clip_ir(tiny):
    return lower(*tiny)


def dynamic_reference(scores, features, mass, least, most):
    out, counts = np.zeros((len(scores), most, features.shape[-1]), np.float32), []
    for n, s in enumerate(scores.astype(np.float32)):
        order = np.argsort(-s, kind="stable")
        count = int(np.clip(np.sum(np.cumsum(s[order]) < np.float32(mass) * s.sum()) + 1, least, most))
        out[n, :count] = features[n, np.sort(order[:count])]
        counts.append(count)
    return out, counts


@pytest.mark.parametrize("config", [{"method": "norm", "mass": 0.3, "min": 4, "max": 40},
                                    {"method": "cls_attention", "mass": 0.5, "max": 48},
                                    {"method": "attention_entropy", "mass": 0.5, "min": 2, "layer": 1}])
def test_onnxruntime_matches_numpy_on_fresh_images(config, clip_ir, rng):
    ir = copy.deepcopy(clip_ir)
    vision = ir.components["vision"]
    pixels = rng.normal(size=(3, *vision.inputs[0].shape[1:])).astype(np.float32)
    budget = tp.plan_budget(tp.TokenPrune.Config(budget="dynamic", **config), ir.config["vision"])
    attention = [n for n in vision.onnx.graph.node if n.op_type == "Attention"][budget.layer]
    names = [tp.projector_entry(vision.onnx.graph).input[0], *attention.input[:2]]
    _, features, q, k = run(vision.onnx, {"pixel_values": pixels}, names)
    report = prune(ir, budget="dynamic", **config)
    verify_ir(ir)
    assert report["max"] == budget.kept and ir.config["vision"]["image_tokens"] == budget.kept
    pruned = ir.components["vision"].onnx
    image_features, count, selected = run(pruned, {"pixel_values": pixels}, [tp.projector_entry(pruned.graph).input[0]])
    if config["method"] == "norm":
        scores = np.linalg.norm(features, axis=-1)
    elif config["method"] == "cls_attention":
        scores = softmax(np.einsum("nhd,nhsd->nhs", q[:, :, 0].astype(np.float64), k) / np.sqrt(q.shape[-1])).mean(1)[:, 1:]
    else:
        scores = entropy_reference(q, k, 1)
    expected, counts = dynamic_reference(scores, features, config["mass"], budget.least, budget.kept)
    assert count.tolist() == counts and image_features.shape[1] == budget.kept
    for n, c in enumerate(counts):
        np.testing.assert_allclose(selected[n, :c], expected[n, :c], rtol=1e-5, atol=1e-5)


def test_a_fixed_budget_dumps_as_before_budgets_existed():
    """What the manifest records of a fixed budget, so its bundles stay byte-identical to today's."""
    dumped = tp.TokenPrune.Config(keep=16).model_dump()
    assert set(dumped) == {"keep", "method", "layer", "merge", "contextual_tokens", "seed"}
    assert tp.TokenPrune.Config(budget="dynamic", mass=0.9).model_dump()["budget"] == "dynamic"


@pytest.mark.parametrize("config,words", [({"budget": "dynamic"}, "mass"), ({"keep": 4, "mass": 0.5}, "dynamic"),
                                          ({"budget": "dynamic", "mass": 0.5, "min": 9, "max": 3}, "min 9"),
                                          ({"budget": "dynamic", "mass": 0.5, "merge": "contextual"}, "merge")])
def test_dynamic_config_is_checked(config, words):
    with pytest.raises(ValueError, match=words):
        tp.TokenPrune.Config(**config)


@pytest.fixture(scope="module")
def dynamic_bundle(tmp_path_factory):
    return compile_to(*dynamic_tiny_recipe(tmp_path_factory.mktemp("dynamic"), "  - kv_layout: {layout: static}\n"))


def test_shapes_use_max_and_each_image_gets_its_own_count(dynamic_bundle, rng, capsys):
    pipe = load(dynamic_bundle)
    manifest = pipe.manifest
    assert [o["name"] for o in manifest["components"]["vision"]["outputs"]] == ["image_features", "image_token_count"]
    assert manifest["image_token_rules"]["tokens_per_image"] == 40
    assert manifest["profiles"]["llm"]["inputs_embeds"]["max"][1] == 256 + 40
    requests = [Request(random_image(rng, int(rng.integers(20, 120)), int(rng.integers(20, 120))), "What is this?", 6)
                for _ in range(5)]
    batch = pipe.generate_batch(requests)
    counts = [g.image_tokens for g in batch]
    assert len(set(counts)) > 1 and all(4 <= c <= 40 for c in counts)
    for request, ours in zip(requests, batch):
        alone = load(dynamic_bundle).generate_batch([request])[0]
        assert ours.image_tokens == alone.image_tokens
        assert_same_up_to_near_ties(ours, alone)
        assert ours.prompt_tokens == len(pipe.prompt_ids("What is this?")) - 40 + ours.image_tokens
    assert main(["eval", str(dynamic_bundle), "--suite", "digits", "--limit", "3", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    assert metrics["kept_tokens_min"] <= metrics["kept_tokens_mean"] <= metrics["kept_tokens_max"] <= 40


def test_saliency_keeps_the_patches_its_map_marks_and_budgets_follow_it(clip_ir, rng, tmp_path):
    """Bright patches (8 x 8 pixels of the 64 px image) are the salient ones: fixed keeps them, dynamic counts them."""
    source = channel_mean_saliency(tmp_path / "saliency.onnx")
    chosen = [np.sort(rng.choice(64, 5, replace=False)) for _ in range(2)]
    pixels = 0.01 * rng.normal(size=(2, 3, 64, 64)).astype(np.float32)
    for image, patches in enumerate(chosen):
        for patch, level in zip(patches, [5, 9, 6, 8, 7]):
            pixels[image, :, 8 * (patch // 8):8 * (patch // 8 + 1), 8 * (patch % 8):8 * (patch % 8 + 1)] = level
    vision = clip_ir.components["vision"].onnx
    _, features = run(vision, {"pixel_values": pixels}, [tp.projector_entry(vision.graph).input[0]])
    fixed, dynamic = copy.deepcopy(clip_ir), copy.deepcopy(clip_ir)
    prune(fixed, keep=5, method="saliency", saliency_model=source)
    prune(dynamic, budget="dynamic", mass=0.99, method="saliency", saliency_model=source)
    for ir in (fixed, dynamic):
        pruned = ir.components["vision"].onnx
        onnx.checker.check_model(pruned)
        outputs = run(pruned, {"pixel_values": pixels}, [tp.projector_entry(pruned.graph).input[0]])
        if ir is dynamic:
            assert outputs[1].tolist() == [5, 5]
        for image in range(2):
            np.testing.assert_allclose(outputs[-1][image, :5], features[image, chosen[image]], rtol=1e-6, atol=1e-6)


def test_an_unreadable_saliency_model_is_refused_naming_the_fix(clip_ir, tmp_path):
    (tmp_path / "bad.onnx").write_text("not onnx")
    with pytest.raises(UserError, match="cannot be read as ONNX"):
        prune(copy.deepcopy(clip_ir), keep=5, method="saliency", saliency_model=str(tmp_path / "bad.onnx"))


@pytest.mark.parametrize("config", [{"budget": "dynamic", "mass": 0.9, "max": 32},
                                    {"keep": 16, "method": "attention_entropy"}])
def test_the_new_selections_are_placeable_on_tensorrt(config, clip_ir):
    ir = copy.deepcopy(clip_ir)
    prune(ir, **config)
    placement = place_component(ir.components["vision"])
    refused = [(n.name, v.reason) for n, v in zip(ir.components["vision"].onnx.graph.node, placement.verdicts)
               if n.name.startswith(("token_prune/", "image_token_count")) and v is not None]
    assert not refused and len(placement.segments) == 1
