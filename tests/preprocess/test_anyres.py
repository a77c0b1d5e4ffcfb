"""Any-resolution images in numpy against transformers: the tiles are the processor's pixel values exactly, the
token counts the processor's, and the packed features the model's (exact for LLaVA-NeXT; OneVision's bilinear
pooling within float rounding), on square, very wide, very tall, the smallest and the largest images."""

import functools
import json

import numpy as np
import pytest
import torch

from builders import random_image
from mmtrt.preprocess import anyres
from mmtrt.ir.export import VisionWithProjector
from mmtrt.ir.facts import with_item_tokens
from mmtrt.ir.frontend import model_facts
from mmtrt.ir.preprocess import spec_from_image_processor
from mmtrt.recipe import Envelope
from mmtrt.zoo.tiny_anyres import build_tiny_llava_next, build_tiny_llava_onevision

BUILDERS = {"llava_next": build_tiny_llava_next, "llava_onevision": build_tiny_llava_onevision}
# torch's bilinear interpolate and ours round differently (its kernel fuses multiply-adds): measured up to 4.8e-7
# on features of magnitude ~3; the bound is a few float32 ulps of the largest feature.
POOLING_ATOL = 1e-6


@pytest.fixture(scope="module", params=list(BUILDERS))
def family(request):
    model, processor = BUILDERS[request.param]()
    spec = spec_from_image_processor(processor.image_processor)
    return model, processor, spec, model_facts(model.config, model.generation_config, processor, spec)


@functools.cache
def largest(family_name: str, vision_json: str) -> tuple[int, int]:
    """The image size that takes the most tokens, searched over every size up to 160 pixels (beyond the tiny
    models' largest grids, 128 pixels)."""
    vision = json.loads(vision_json)
    return max(((h, w) for h in range(1, 161) for w in range(1, 161)),
               key=lambda s: anyres.image_tokens(*s, vision["anyres"], vision["tile_tokens"]))


def sizes(facts):
    """(height, width): square, very wide, very tall, the smallest, the largest, and a photo-sized one."""
    return [(45, 45), (24, 230), (230, 24), (1, 1), largest(facts["architecture"], json.dumps(facts["vision"])),
            (480, 640)]


def hf_tokens(processor, image) -> int:
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}], add_generation_prompt=True)
    inputs = processor(images=image, text=text, return_tensors="pt")
    return int((inputs["input_ids"] == processor.image_token_id).sum())


def test_tiles_are_the_processors_pixel_values_exactly(family, rng):
    _, processor, spec, _ = family
    tiler = anyres.build_tiler(spec)
    for height, width in sizes(family[3]):
        image = random_image(rng, height, width)
        expected = processor.image_processor(images=image, return_tensors="np")["pixel_values"][0]
        np.testing.assert_array_equal(tiler(image), expected)


def test_token_counts_are_the_processors_and_the_largest_reaches_the_bound(family, rng):
    _, processor, _, facts = family
    vision = facts["vision"]
    for height, width in sizes(facts):
        count = anyres.image_tokens(height, width, vision["anyres"], vision["tile_tokens"])
        assert count == hf_tokens(processor, random_image(rng, height, width)), (height, width)
        assert count <= vision["image_tokens"]
    assert anyres.image_tokens(*sizes(facts)[4], vision["anyres"], vision["tile_tokens"]) == vision["image_tokens"]


def test_packed_features_are_the_models(family, rng):
    model, processor, spec, facts = family
    vision = facts["vision"]
    tiles_of = VisionWithProjector(model, vision["feature_layer"], vision["select_strategy"])
    newline = model.model.image_newline.detach().numpy()
    tolerance = 0 if vision["anyres"]["max_patches"] is None else POOLING_ATOL
    for height, width in sizes(facts):
        image = random_image(rng, height, width)
        inputs = processor.image_processor(images=image, return_tensors="pt")
        with torch.no_grad():
            expected = model.model.get_image_features(inputs["pixel_values"], inputs["image_sizes"]).pooler_output[0]
            tiles = tiles_of(torch.from_numpy(anyres.build_tiler(spec)(image))).numpy()
        packed = anyres.pack(tiles, None, height, width, vision["anyres"], newline)
        np.testing.assert_allclose(packed, expected.numpy(), rtol=0, atol=tolerance)


@pytest.mark.parametrize("shape", [(16, 16, 8, 8), (16, 11, 13, 9), (12, 16, 9, 12), (40, 33, 17, 29)])
def test_bilinear_pooling_is_torchs_within_float_rounding(rng, shape):
    height, width, out_h, out_w = shape
    grid = rng.normal(size=(height, width, 24)).astype(np.float32)
    expected = torch.nn.functional.interpolate(torch.from_numpy(grid.transpose(2, 0, 1))[None], [out_h, out_w],
                                               mode="bilinear")[0].numpy().transpose(1, 2, 0)
    np.testing.assert_allclose(anyres.bilinear(grid, out_h, out_w), expected, rtol=0, atol=POOLING_ATOL)


def test_max_tiles_bounds_the_tokens_and_per_tile_pruning_multiplies_them(family):
    _, _, _, facts = family
    module = __import__(f"mmtrt.ir.families.{facts['architecture']}", fromlist=["fit_envelope"])
    narrowed = module.fit_envelope(facts, Envelope.model_validate({"image": {"max_tiles": 2}}))
    vision = narrowed["vision"]
    allowed = [p for p in vision["anyres"]["pinpoints"] if p[0] * p[1] <= 2 * vision["anyres"]["tile"] ** 2]
    assert vision["anyres"]["max_tiles"] == 2 and vision["image_tokens"] == max(
        anyres.image_tokens(*p, vision["anyres"], vision["tile_tokens"]) for p in allowed) < facts["vision"]["image_tokens"]
    pruned = with_item_tokens(vision, 5)
    assert pruned["anyres"]["layout"] == "tiles" and pruned["image_tokens"] == 3 * 5
    assert anyres.image_tokens(20, 61, pruned["anyres"], 5) == 5 * (1 + np.prod(
        anyres.grid_tiles(20, 61, vision["anyres"]["pinpoints"], vision["anyres"]["tile"])))
