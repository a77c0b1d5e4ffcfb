"""The envelope bounds the preprocessed tensor, not the user's file: any image the preprocessing can resize is
taken unless the recipe bounds the file's sides; an image whose resize would explode is refused in one line."""

import numpy as np
import pytest
from PIL import Image

from builders import random_image
from mmtrt.errors import UserError
from mmtrt.runtime import load
from mmtrt.runtime.image_bounds import check_image

SHORT_SIDE_RESIZE = {"ops": [{"op": "resize", "size": [64]}, {"op": "center_crop", "size": [64, 64]}]}


@pytest.mark.parametrize("size", [(8, 8), (15, 40), (5000, 300)])
def test_any_size_the_processor_resizes_is_taken(tiny_bundle, rng, size):
    pipe = load(tiny_bundle)
    assert pipe.manifest["envelope"]["image"] == {"min_side": None, "max_side": None, "max_tiles": None}
    image = random_image(rng, size[1], size[0])
    assert pipe.pixel_values(image).shape == (1, 3, 64, 64)
    assert pipe.generate(image, "hi", max_new_tokens=1).token_ids


def test_a_recipe_may_still_bound_the_file():
    bounds = {"min_side": 32, "max_side": 1024}
    check_image(Image.new("RGB", (32, 1024)), bounds, SHORT_SIDE_RESIZE)
    for size in [(31, 100), (100, 1025)]:
        with pytest.raises(UserError, match=f"image is {size[0]}x{size[1]}; .*from 32 to 1024 .*envelope.image"):
            check_image(Image.new("RGB", size), bounds, SHORT_SIDE_RESIZE)


def test_a_resize_that_would_explode_is_refused():
    strip = Image.new("RGB", (2_000_000, 1))
    with pytest.raises(UserError, match="resizes its short side to 64, giving 128000000x64 pixels.*closer to square"):
        check_image(strip, {"min_side": None, "max_side": None}, SHORT_SIDE_RESIZE)
    check_image(strip, {}, {"ops": [{"op": "resize", "size": [64, 64]}]})  # a fixed-size resize is harmless
    assert np.prod(strip.size) < Image.MAX_IMAGE_PIXELS  # the decoder's own bomb guard would not have caught it
