"""Qwen2-VL's runtime arithmetic against transformers' own: the processor's pixel_values and grid (tolerance 0: the
same integer resize, the same float32 normalize, a permutation), the vision tower's index inputs, the M-RoPE
positions; and what `compile --plan` says of a Qwen2-VL recipe, without exporting anything."""

import numpy as np
import pytest
import torch
from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

from builders import random_image
from mmtrt.compiler import make_plan
from mmtrt.errors import UserError
from mmtrt.ir.families.qwen2_vl import REFUSED_PASSES, preprocess_spec
from mmtrt.runtime.qwen2_vl import mrope_positions, preprocess, vision_indices
from mmtrt.zoo.tiny_qwen2_vl import build_tiny_qwen2_vl

# (height, width): square, very wide, very tall, under min_pixels, over max_pixels, odd sides, a 150:1 strip
SIZES = [(64, 64), (40, 700), (700, 40), (20, 20), (600, 600), (113, 141), (3, 450), (1, 1)]


@pytest.fixture(scope="module")
def qwen():
    return build_tiny_qwen2_vl("qwen2_5_vl")


@pytest.mark.parametrize("size", SIZES)
def test_patches_and_grid_equal_the_processor(qwen, rng, size):
    processor = qwen[1].image_processor
    image = random_image(rng, *size)
    want = processor(images=image, return_tensors="np")
    got = preprocess(image, preprocess_spec(processor))
    assert list(got.grid) == want["image_grid_thw"][0].tolist()
    assert got.values.dtype == np.float32 and np.array_equal(got.values, want["pixel_values"])


def test_grayscale_and_transparent_images_equal_the_processor(qwen, rng):
    processor = qwen[1].image_processor
    rgba = random_image(rng, 50, 90).convert("RGBA")
    rgba.putalpha(128)
    for image in (random_image(rng, 70, 30).convert("L"), rgba):
        got = preprocess(image, preprocess_spec(processor))
        assert np.array_equal(got.values, processor(images=image, return_tensors="np")["pixel_values"])


@pytest.mark.parametrize("grid", [(1, 6, 10), (1, 2, 36), (1, 36, 2), (1, 14, 14), (1, 2, 2)])
def test_vision_indices_equal_transformers(grid):
    config = {"spatial_merge_size": 2, "window_size": 112, "patch_size": 14}  # windows of 4x4 merge blocks
    got = vision_indices(grid, config)
    thw = torch.tensor([grid])
    assert np.array_equal(got["patch_pos"], get_vision_position_ids(thw, 2).numpy())
    index, cu = get_vision_window_index(thw, 2, 112, 14)
    assert np.array_equal(got["window_index"], index.numpy())
    assert np.array_equal(got["window_index"][got["window_reverse"]], np.arange(index.numel()))
    # window_id runs window by window, its run lengths transformers' cu_window_seqlens
    assert np.array_equal(np.concatenate([[0], np.cumsum(np.bincount(got["window_id"]))]), cu.numpy())
    assert np.all(np.diff(got["window_id"]) >= 0)


@pytest.mark.parametrize("grid", [(1, 6, 10), (1, 2, 36), (1, 4, 4)])
def test_mrope_positions_equal_get_rope_index(qwen, grid):
    model, processor = qwen
    token = model.config.image_token_id
    count = grid[1] * grid[2] // 4
    ids = [5, 6, 7] + [token] * count + [8, 9]
    types = torch.tensor([[int(t == token) for t in ids]])
    want, delta = model.model.get_rope_index(torch.tensor([ids]), types, torch.tensor([grid]))
    got, got_delta = mrope_positions(ids, token, [grid], 2)
    assert np.array_equal(got, want[:, 0].numpy()) and got_delta == int(delta)


def recipe(tmp_path, qwen, passes=""):
    model, processor = qwen
    model.config.save_pretrained(tmp_path / "checkpoint")  # the plan reads configs, never weights
    model.generation_config.save_pretrained(tmp_path / "checkpoint")
    processor.save_pretrained(tmp_path / "checkpoint")
    path = tmp_path / "recipe.yaml"
    path.write_text(f"model: {{source: hf, path: checkpoint}}\n{passes}")
    return path


def test_plan_bounds_tokens_by_the_processor_pixels(tmp_path, qwen):
    plan = make_plan(recipe(tmp_path, qwen)).to_json()
    dims = plan["dims_after_passes"]
    assert dims["tokens"] == {"min": 1, "opt": 20, "max": 20}  # max_pixels 20 x 28^2
    assert dims["patches"] == {"min": 4, "opt": 80, "max": 80}
    assert dims["seq"]["max"] == 256 + 20 and plan["image_tokens_after_passes"] == 20


VALID_OPTIONS = {"token_prune": "{keep: 0.5}", "channel_prune": "{vision: {mlp: 0.25}}"}


@pytest.mark.parametrize("name", sorted(REFUSED_PASSES))
def test_plan_refuses_passes_with_the_reason(tmp_path, qwen, name):
    with pytest.raises(UserError) as info:  # options the recipe check takes: the refusal is the family's
        make_plan(recipe(tmp_path, qwen, f"passes:\n  - {name}: {VALID_OPTIONS.get(name, '{}')}\n"))
    assert str(info.value) == f"passes[0].{name} is refused for this model: {REFUSED_PASSES[name]}"
