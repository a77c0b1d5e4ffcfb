"""token_prune keeps exactly the tokens its criterion picks, in spatial order, and everything downstream follows."""

import copy
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from builders import make_model, random_image, tensor
from conftest import ROOT, SIGLIP_SIZES, compile_to
from mmtrt.cli import main
from mmtrt.compiler import make_plan
from mmtrt.errors import UserError
from mmtrt.ir.frontend import lower
from mmtrt.ir.graph import Component, ModelIR
from mmtrt.partition.placement import place_component
from mmtrt.pipeline.instruments import verify_ir
from mmtrt.runtime import load
from mmtrt.zoo.tiny_llava import build_tiny_llava
from passes.vision.token_prune import TokenPrune, plan_budget, projector_entry

from token_prune_graphs import GRID, HEADS, HEAD_DIM, one_layer_tower, prune, run, softmax


def attends_to(rng, chosen, strengths):
    """q, k for one image whose [CLS] query attends (almost) only to the chosen patches, with these strengths."""
    q = rng.normal(size=(HEADS, GRID + 1, HEAD_DIM)).astype(np.float32)
    k = 0.05 * rng.normal(size=q.shape).astype(np.float32)
    for patch, strength in zip(chosen, strengths):
        k[:, 1 + patch] = strength * q[:, 0] / np.sum(q[:, 0] ** 2, axis=-1, keepdims=True)
    return q, k


def test_cls_attention_keeps_exactly_the_attended_patches_in_spatial_order(rng):
    ir = one_layer_tower(rng)
    chosen = [np.sort(rng.choice(GRID, 4, replace=False)) for _ in range(2)]
    # Strengths out of spatial order, so TopK's order (by score) differs from the order the output must have.
    pairs = [attends_to(rng, c, [30, 60, 40, 50]) for c in chosen]
    feeds = {"q": np.stack([p[0] for p in pairs]), "k": np.stack([p[1] for p in pairs]),
             "v": rng.normal(size=(2, HEADS, GRID + 1, HEAD_DIM)).astype(np.float32)}
    before = run(ir.components["vision"].onnx, feeds)[0]
    report = prune(ir, keep=4)
    after = run(ir.components["vision"].onnx, feeds)[0]
    assert report["tokens_after"] == 4 and ir.config["vision"]["image_tokens"] == 4
    assert after.shape == (2, 4, 5)
    for image in range(2):
        np.testing.assert_allclose(after[image], before[image, chosen[image]], rtol=1e-6, atol=1e-6)
    onnx.checker.check_model(ir.components["vision"].onnx, full_check=True)


def test_without_a_projector_the_pass_refuses(rng):
    ir = one_layer_tower(rng)
    graph = ir.components["vision"].onnx.graph
    graph.node[-2].op_type = "Mul"  # the second projector MatMul becomes elementwise: no projector left
    with pytest.raises(ValueError, match="projector"):
        prune(ir, keep=4)


@pytest.fixture(scope="module")
def clip_ir(tiny):
    return lower(*tiny)


@pytest.fixture(scope="module")
def siglip_ir():
    return lower(*build_tiny_llava(**SIGLIP_SIZES))


def reference(features, q, k, config, budget):
    """numpy: the projector inputs token_prune must produce, from the unpruned tensors."""
    c = budget.cls
    if config["method"] == "cls_attention":
        logits = np.einsum("nhd,nhsd->nhs", q[:, :, 0].astype(np.float64), k) / np.sqrt(q.shape[-1])
        scores = softmax(logits).mean(1)[:, c:]
    elif config["method"] == "norm":
        scores = np.linalg.norm(features, axis=-1)
    else:
        draw = np.random.default_rng(config.get("seed", 0)).random(budget.tokens, dtype=np.float32)
        scores = np.broadcast_to(draw, features.shape[:2])
    order = np.argsort(-scores, axis=1, kind="stable")
    out = []
    for n in range(len(features)):
        kept = features[n, np.sort(order[n, :budget.dominant])]
        if budget.contextual:
            kept = np.concatenate([kept, contextual(features[n], k[n], np.sort(order[n, budget.dominant:]), budget)])
        out.append(kept)
    return np.stack(out)


def contextual(features, keys, rest, budget):
    """VisionZip's merge, written out: targets every step-th dropped token, the others join the nearest key."""
    keys = keys.mean(0)[budget.cls:]
    keys = keys / np.linalg.norm(keys, axis=-1, keepdims=True)
    step = max(1, len(rest) // budget.contextual)
    at = np.arange(0, len(rest), step)[:budget.contextual]
    targets, merged = rest[at], np.delete(rest, at)
    nearest = (keys[merged] @ keys[targets].T).argmax(1)
    return np.stack([features[t] + (features[merged[nearest == j]].mean(0) if np.any(nearest == j) else 0)
                     for j, t in enumerate(targets)])


CASES = [
    ("clip", {"method": "cls_attention", "keep": 0.25}),
    ("clip", {"method": "cls_attention", "keep": 20, "merge": "contextual", "contextual_tokens": 5}),
    ("clip", {"method": "norm", "keep": 0.5}),
    ("clip", {"method": "random", "keep": 9, "seed": 3}),
    ("siglip", {"method": "norm", "keep": 12, "merge": "contextual"}),
    ("siglip", {"method": "random", "keep": 0.125, "layer": 1, "merge": "contextual"}),
]


@pytest.mark.parametrize("tower,config", CASES, ids=[f"{t}-{c['method']}-{c.get('merge', 'none')}" for t, c in CASES])
def test_onnxruntime_matches_numpy_on_fresh_images(tower, config, clip_ir, siglip_ir, rng):
    ir = copy.deepcopy(clip_ir if tower == "clip" else siglip_ir)
    vision = ir.components["vision"]
    pixels = rng.normal(size=(2, *vision.inputs[0].shape[1:])).astype(np.float32)
    budget = plan_budget(TokenPrune.Config(**config), ir.config["vision"])
    attention = [n for n in vision.onnx.graph.node if n.op_type == "Attention"][budget.layer]
    names = [projector_entry(vision.onnx.graph).input[0], *attention.input[:2]]
    _, features, q, k = run(vision.onnx, {"pixel_values": pixels}, names)
    prune(ir, **config)
    verify_ir(ir)
    _, selected = run(ir.components["vision"].onnx, {"pixel_values": pixels},
                      [projector_entry(ir.components["vision"].onnx.graph).input[0]])
    assert selected.shape == (2, budget.kept, features.shape[-1])
    np.testing.assert_allclose(selected, reference(features, q, k, config, budget), rtol=1e-5, atol=1e-5)


def test_cls_attention_reads_the_layer_transformers_reports(tiny, clip_ir, rng):
    """The kept tokens are the top-k of transformers' own [CLS] attention weights at the feature layer."""
    import torch

    model, _ = tiny
    ir = copy.deepcopy(clip_ir)
    pixels = rng.normal(size=(2, *ir.components["vision"].inputs[0].shape[1:])).astype(np.float32)
    before = run(ir.components["vision"].onnx, {"pixel_values": pixels})[0]
    prune(ir, keep=16)
    after = run(ir.components["vision"].onnx, {"pixel_values": pixels})[0]
    tower = model.model.vision_tower
    previous = tower.config._attn_implementation
    tower.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            weights = tower(torch.from_numpy(pixels), output_attentions=True).attentions
    finally:
        tower.set_attn_implementation(previous)
    layer = model.config.vision_feature_layer % (model.config.vision_config.num_hidden_layers + 1) - 1
    scores = weights[layer][:, :, 0, 1:].mean(1).numpy()
    for image in range(2):
        kept = np.sort(np.argsort(-scores[image])[:16])
        np.testing.assert_allclose(after[image], before[image, kept], rtol=1e-5, atol=1e-5)


def train_projector_script():
    import importlib.util

    pytest.importorskip("mmtrt.zoo.pretrained", reason="scripts/train_projector.py needs the zoo extras")
    spec = importlib.util.spec_from_file_location("train_projector", ROOT / "scripts" / "train_projector.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("method", ["cls_attention", "norm"])
def test_projector_training_keeps_the_tokens_the_pass_keeps(method, tiny, clip_ir, rng):
    """zoo:dino-smollm-page's projector was trained on each criterion's own choice (train_projector --select):
    the tokens training keeps are the ones the compiled graph keeps."""
    import torch

    train = train_projector_script()
    model, processor = tiny
    images = [random_image(rng, 40, 56) for _ in range(3)]
    features, attention = train.tower_features(model, processor, images, with_attention=True)
    pixels = processor.image_processor(images=images, return_tensors="np")["pixel_values"].astype(np.float32)
    ir = copy.deepcopy(clip_ir)
    prune(ir, keep=16, method=method)
    after = run(ir.components["vision"].onnx, {"pixel_values": pixels})[0]
    kept = train.drop_tokens(features, train.selection_scores(method, features, attention, None), 16)
    with torch.no_grad():
        np.testing.assert_allclose(after, model.model.multi_modal_projector(kept).numpy(), rtol=1e-4, atol=1e-4)


def test_inserted_nodes_are_all_placeable_on_tensorrt(clip_ir):
    ir = copy.deepcopy(clip_ir)
    prune(ir, keep=16, merge="contextual")
    placement = place_component(ir.components["vision"])
    refused = [(n.name, v.reason) for n, v in zip(ir.components["vision"].onnx.graph.node, placement.verdicts)
               if n.name.startswith("token_prune/") and v is not None]
    assert not refused
    assert len(placement.segments) == 1


def test_keep_one_changes_nothing(clip_ir):
    ir = copy.deepcopy(clip_ir)
    report = prune(ir, keep=1.0)
    assert report["graph_changed"] is False
    assert ir.components["vision"].onnx.SerializeToString() == clip_ir.components["vision"].onnx.SerializeToString()
    assert ir.config == clip_ir.config


@pytest.mark.parametrize("config,words", [
    ({"keep": 1.5}, "ratio outside (0, 1]"),
    ({"keep": 0}, "keeps no token"),
    ({"keep": 0.5, "contextual_tokens": 4}, "needs merge: contextual"),
    ({"keep": 0.5, "method": "nearest"}, "method"),
])
def test_config_is_checked(config, words):
    from mmtrt.pipeline.runner import plan_passes
    from mmtrt.recipe import Recipe

    recipe = Recipe.model_validate({"model": {"source": "zoo", "name": "tiny-llava"},
                                    "passes": [{"token_prune": config}]})
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        plan_passes(recipe, set(), {"vision"})


@pytest.mark.parametrize("config,words", [
    ({"keep": 65}, "at most 64"),
    ({"keep": 8, "merge": "contextual", "contextual_tokens": 8}, "leaves no dominant token"),
    ({"keep": 8, "layer": -1}, "hidden-state index from 1 to 3"),
    ({"keep": 8, "layer": 0}, "hidden-state index from 1 to 3"),
])
def test_budget_is_checked_against_the_model(config, words, clip_ir):
    with pytest.raises(UserError, match=words):
        plan_budget(TokenPrune.Config(**config), clip_ir.config["vision"])


def test_plan_refuses_cls_attention_without_cls_and_suggests_norm(siglip_checkpoint, capsys):
    recipe = siglip_checkpoint.parent / "prune.yaml"
    recipe.write_text("model: {source: hf, path: checkpoint}\npasses:\n  - dead_layer_elimination: {}\n"
                      "  - token_prune: {keep: 0.5}\n")
    assert main(["compile", str(recipe), "--plan"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "passes[1].token_prune" in err and "[CLS]" in err and "use method: norm" in err
    recipe.write_text("model: {source: hf, path: checkpoint}\npasses:\n  - token_prune: {keep: 0.5, method: norm}\n")
    plan = make_plan(recipe).to_json()
    assert (plan["image_tokens_before_passes"], plan["image_tokens_after_passes"]) == (36, 18)


def pruned_recipe(keep) -> str:
    """The demo recipe with token_prune after its lossless passes."""
    text = (ROOT / "recipes" / "tiny-llava.yaml").read_text()
    return text.replace("  - graph_cleanup: {}\n", f"  - graph_cleanup: {{}}\n  - token_prune: {{keep: {keep}}}\n")


def test_keep_one_bundle_equals_the_unpruned_bundle(tiny_bundle, tmp_path):
    bundle = compile_to(tmp_path, pruned_recipe(1.0))
    ours, theirs = (json.loads((b / "manifest.json").read_text()) for b in (bundle, tiny_bundle))
    assert ours["artifacts"] == theirs["artifacts"]
    assert ours["dims"] == theirs["dims"] and ours["model"] == theirs["model"]


def test_shape_planning_and_runtime_follow_the_kept_count(tmp_path, rng, capsys):
    recipe_text = pruned_recipe(16)
    assert "token_prune" in recipe_text
    (tmp_path / "recipe.yaml").write_text(recipe_text)
    assert main(["compile", str(tmp_path / "recipe.yaml"), "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["image_tokens_after_passes"] == 16 and plan["dims_after_passes"]["seq"]["max"] == 256 + 16
    bundle = compile_to(tmp_path, recipe_text)
    pipe = load(bundle)
    manifest = pipe.manifest
    assert manifest["components"]["vision"]["outputs"][0]["shape"] == ["num_images", 16, 128]
    assert manifest["image_token_rules"]["tokens_per_image"] == 16
    assert manifest["dims"] == plan["dims_after_passes"]
    assert manifest["dims"]["total"]["max"] == 256 + 16 + 32
    assert manifest["profiles"]["llm"]["inputs_embeds"]["max"] == [4, 272, 128]
    ids = pipe.prompt_ids("What is this?")
    assert ids.count(pipe.model["image_token_id"]) == 16
    result = pipe.generate(random_image(rng, 50, 70), "What is this?", max_new_tokens=3)
    assert result.prompt_tokens == len(ids) and len(result.token_ids) >= 1


def test_a_blown_accuracy_budget_stops_the_compile_and_names_the_pass(tmp_path, rng, capsys):
    """2 random image tokens of tiny-llava's cannot keep the source model's answers on images: the agreement
    budget, measured after the pass on the user's image prompts, refuses the compile and names it."""
    for i in range(2):
        random_image(rng, 48 + 8 * i, 64).save(tmp_path / f"{i}.png")
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"image": f"{i}.png", "prompt": "What is in the picture?"}) + "\n" for i in range(2)))
    (tmp_path / "recipe.yaml").write_text(
        "model: {source: zoo, name: tiny-llava}\n"
        "passes:\n  - graph_cleanup: {}\n  - token_prune: {method: random, keep: 2}\n"
        "evaluate: {agreement: {data: prompts.jsonl, max_new_tokens: 4}}\n"
        "budgets: {agreement_kl_increase: 0.000001}\n")
    assert main(["compile", str(tmp_path / "recipe.yaml"), "-o", str(tmp_path / "out")]) == 2
    report = capsys.readouterr().err.strip().splitlines()[-1]
    assert report.startswith("mmtrt: error: accuracy budget exceeded: agreement_kl_increase")
    assert "passes[1] token_prune cost agreement_top1_drop" in report and "no bundle was written" in report
    assert not (tmp_path / "out").exists()
