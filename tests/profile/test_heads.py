"""Entropy, redundancy, alignment and saliency from the bundle's probe graphs against a numpy computation on
transformers' own attention weights (eager attention, output_attentions) of the same tiny LLaVA."""

import numpy as np
import pytest
import torch

from builders import random_image
from mmtrt.profile import heads
from mmtrt.runtime import load
from mmtrt.zoo.tiny_llava import build_tiny_llava

ATOL = 1e-4


@pytest.fixture(scope="module")
def eager():
    model, _ = build_tiny_llava()
    model.set_attn_implementation("eager")
    return model


def np_entropy(p):
    p = p.astype(np.float64)
    return np.where(p > 0, -p * np.log(np.where(p > 0, p, 1)), 0).sum(-1).mean(axis=(0, 2))


def np_cosines(o):
    flat = np.moveaxis(o, 1, 0).reshape(o.shape[1], -1)
    flat = flat / np.linalg.norm(flat, axis=1, keepdims=True)
    return flat @ flat.T


def capture_values(layers):
    """Each layer's v_proj output, via forward hooks."""
    values, handles = [], []
    for layer in layers:
        handles.append(layer.self_attn.v_proj.register_forward_hook(lambda m, i, o: values.append(o.detach())))
    return values, handles


def head_outputs(attn, v, heads, kv_heads):
    """Per head, attention weights times that head's values (grouped-query heads share a KV head)."""
    b, s, _ = v.shape
    v = v.numpy().astype(np.float64).reshape(b, s, kv_heads, -1).transpose(0, 2, 1, 3)
    v = np.repeat(v, heads // kv_heads, axis=1)
    return attn.astype(np.float64) @ v


def reference(model, pixels, ids):
    tower = model.model.vision_tower
    vals, handles = capture_values(tower.encoder.layers)
    lm_vals, lm_handles = capture_values(model.model.language_model.layers)
    with torch.no_grad():
        vis = tower(torch.from_numpy(pixels), output_attentions=True, output_hidden_states=True)
        features = model.model.multi_modal_projector(vis.hidden_states[-2][:, 1:])[0].numpy()
        out = model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels), output_attentions=True)
        text = model.get_input_embeddings()(torch.from_numpy(ids))[0].numpy()
    for h in handles + lm_handles:
        h.remove()
    vcfg, tcfg = model.config.vision_config, model.config.text_config
    vision = [(a.numpy(), head_outputs(a.numpy(), v, vcfg.num_attention_heads, vcfg.num_attention_heads))
              for a, v in zip(vis.attentions, vals[:len(vis.attentions)])]
    llm = [(a.numpy(), head_outputs(a.numpy(), v, tcfg.num_attention_heads, tcfg.num_key_value_heads))
           for a, v in zip(out.attentions, lm_vals)]
    return vision, llm, features, text, vis


def test_heads_match_numpy_on_transformers_attention(tiny_bundle, eager, rng):
    pipe = load(tiny_bundle, threads=1)
    pixels = pipe.pixel_values(random_image(rng, int(rng.integers(40, 120)), int(rng.integers(40, 120))))
    ids = np.array([pipe.prompt_ids("Where is the red square, and what lies under it?")], np.int64)
    got = heads.analyse(pipe, pixels, ids)
    vision, llm, features, text, vis = reference(eager, pixels, ids)

    # dead_layer_elimination removed the layers after the feature layer: the bundle has the first ones
    assert 0 < len(got["vision"]) < len(vision) and len(got["llm"]) == len(llm)
    for rows, ref in ((got["vision"], vision), (got["llm"], llm)):
        for row, (attn, outputs) in zip(rows, ref):
            np.testing.assert_allclose(row["entropy"], np_entropy(attn), atol=ATOL)
            sim = np_cosines(outputs)
            np.testing.assert_allclose(row["similarity"], sim, atol=ATOL)
            np.testing.assert_allclose(row["redundancy"], (sim - 2 * np.eye(len(sim))).max(1), atol=ATOL)

    image = ids[0] == pipe.model["image_token_id"]
    a = features / np.linalg.norm(features, axis=1, keepdims=True)
    b = text[~image] / np.linalg.norm(text[~image], axis=1, keepdims=True)
    cos = a.astype(np.float64) @ b.T.astype(np.float64)
    assert got["alignment"]["mean_cosine"] == pytest.approx(cos.mean(), abs=ATOL)
    np.testing.assert_allclose(got["alignment"]["best_text_cosine_per_image_token"], cos.max(1), atol=ATOL)

    layer = got["saliency"]["cls_attention_layer"]
    assert layer == len(got["vision"]) - 1  # the feature layer's attention, which token_prune reads by default
    np.testing.assert_allclose(got["saliency"]["cls_attention"],
                               vis.attentions[layer][0, :, 0, 1:].mean(0).numpy(), atol=ATOL)
    np.testing.assert_allclose(got["saliency"]["norm"], np.linalg.norm(vis.hidden_states[-2][0, 1:].numpy(), axis=1),
                               rtol=1e-4)


def test_entropy_of_uniform_and_one_hot_attention():
    uniform = np.full((1, 2, 3, 8), 1 / 8)
    one_hot = np.zeros((1, 2, 3, 8))
    one_hot[..., 0] = 1
    np.testing.assert_allclose(heads.entropy(uniform), np.log(8))
    np.testing.assert_allclose(heads.entropy(one_hot), 0)


def test_kept_patches_are_the_top_scores_in_spatial_order(rng):
    scores = rng.random(64).tolist()
    kept = heads.kept_patches(scores, 0.25)
    assert kept == sorted(kept) and len(kept) == 16
    assert min(scores[i] for i in kept) > max(s for i, s in enumerate(scores) if i not in kept)
