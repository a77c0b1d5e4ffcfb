"""The preprocessing spec, run by the TorchVision backend, reproduces the HF image processor it was read from."""

import json

import numpy as np
import pytest
from PIL import Image
from transformers import (
    BitImageProcessor,
    BitImageProcessorPil,
    CLIPImageProcessor,
    CLIPImageProcessorPil,
    ConvNextImageProcessor,
    LlavaImageProcessor,
    LlavaImageProcessorPil,
    SiglipImageProcessor,
    SiglipImageProcessorPil,
)
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from mmtrt.preprocess.torchvision_transform import preprocess
from mmtrt.errors import UserError
from mmtrt.ir.preprocess import spec_from_image_processor

# Fresh images every run; the seed is in every failure message so a failing run can be replayed.
SEED = np.random.SeedSequence().entropy

CLIP = {"size": {"shortest_edge": 56}, "crop_size": {"height": 48, "width": 48}}
SIGLIP = {"size": {"height": 40, "width": 64}}  # fixed non-square resize, no crop
DINOV2 = {  # transformers maps dinov2 to BitImageProcessor; ImageNet statistics as in facebook/dinov2-*
    "size": {"shortest_edge": 40},
    "crop_size": {"height": 32, "width": 36},
    "image_mean": IMAGENET_DEFAULT_MEAN,
    "image_std": IMAGENET_DEFAULT_STD,
}

# (torchvision-backed class, PIL-backed class, kwargs)
PROCESSORS = {
    "clip": (CLIPImageProcessor, CLIPImageProcessorPil, CLIP),
    "llava": (LlavaImageProcessor, LlavaImageProcessorPil, CLIP),
    "siglip": (SiglipImageProcessor, SiglipImageProcessorPil, SIGLIP),
    "dinov2": (BitImageProcessor, BitImageProcessorPil, DINOV2),
}

# Flag and size variants, checked against the torchvision-backed processor only.
VARIANTS = {
    "crop_larger_than_resize": (CLIPImageProcessor, {"size": {"shortest_edge": 40}, "crop_size": {"height": 48, "width": 44}}),
    "no_resize": (CLIPImageProcessor, {**CLIP, "do_resize": False}),
    "no_normalize": (CLIPImageProcessor, {**CLIP, "do_normalize": False}),
    "no_rescale": (SiglipImageProcessor, {**SIGLIP, "do_rescale": False}),
    "bilinear_rescale_only": (SiglipImageProcessor, {**SIGLIP, "resample": 2, "do_normalize": False, "rescale_factor": 1 / 127.5}),
    "scalar_mean_std": (SiglipImageProcessor, {**SIGLIP, "image_mean": 0.5, "image_std": 0.25}),
}
TORCHVISION_CASES = {name: (tv, kwargs) for name, (tv, _, kwargs) in PROCESSORS.items()} | VARIANTS


@pytest.fixture
def rng():
    return np.random.default_rng(SEED)


def _sizes(rng, count=4):
    """Non-square sizes from well below to well above the targets, so both up- and downscaling run."""
    sizes = []
    while len(sizes) < count:
        height, width = (int(v) for v in rng.integers(24, 321, 2))
        if height != width:
            sizes.append((height, width))
    return sizes


def _noise(rng):
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in _sizes(rng)]


def _gradients(rng):
    """Smooth sinusoidal gradients spanning 0..255: photo-like content, unlike noise."""
    images = []
    for h, w in _sizes(rng):
        y, x = np.mgrid[0:h, 0:w] / max(h, w)
        freq, phase = rng.uniform(1, 4, (3, 2)), rng.uniform(0, 2 * np.pi, 3)
        channels = [np.sin(2 * np.pi * (fx * x + fy * y) + p) for (fx, fy), p in zip(freq, phase)]
        images.append(Image.fromarray(np.round(127.5 + 127.5 * np.stack(channels, -1)).astype(np.uint8)))
    return images


def _other_modes(rng):
    """Inputs convert_rgb must handle like transformers: alpha composited onto white, grey expanded."""
    (h, w), (h2, w2) = _sizes(rng, 2)
    rgba = Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA")
    grey = Image.fromarray(rng.integers(0, 256, (h2, w2), dtype=np.uint8), "L")
    palette = grey.convert("P")
    palette.info["transparency"] = 7
    return [rgba, grey, grey.convert("LA"), palette]


def _hf(processor, images):
    return processor(images=images, return_tensors="np")["pixel_values"]


@pytest.mark.parametrize("cls, kwargs", list(TORCHVISION_CASES.values()), ids=list(TORCHVISION_CASES))
def test_matches_torchvision_processor(rng, cls, kwargs):
    # The backend repeats the processor's torchvision calls (uint8 resize, int-anchored crop, rescale fused
    # into normalize in float32), so the outputs agree bit for bit (max error measured: 0.0). 1e-6 rather than
    # equality tolerates float32 rounding noise on other CPUs; any real divergence, such as one uint8 level
    # (>= 1/255/std ~ 0.015) or a crop one pixel off (~2.7), is far above it.
    processor = cls(**kwargs)
    spec = spec_from_image_processor(processor)
    images = _noise(rng) + _gradients(rng) + _other_modes(rng)
    ours, theirs = preprocess(spec, images), _hf(processor, images)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape == (len(images), 3, *spec["output_size"])
    assert np.abs(ours - theirs).max() <= 1e-6, f"seed={SEED}"


# Against the PIL-backed processors the difference is interpolation only. Measured in uint8 levels
# (|difference| * std / rescale_factor) per 4-image batch, 450 random batches per processor and content type,
# sizes and content drawn as in this test:
#   smooth gradients: max 2 levels, batch mean at most 0.14 levels (median 0.005-0.05).
#   uniform noise:    max 23 levels, batch mean at most 0.26 levels; 99% of values within 2 levels.
# Both PIL and torch resize uint8 in two separable passes with the same bicubic kernel (a=-0.5), each pass
# rounding and clamping to 0..255, but they run the passes in a different order. On smooth images that moves
# a value by at most 2 levels (two roundings through a kernel gain of ~1.25). On noise, bicubic overshoot is
# clamped after different passes, which moves a few pixels by tens of levels while the mean stays small.
GRADIENT_MAX_LEVELS, GRADIENT_MEAN_LEVELS = 2.0, 0.25
NOISE_MAX_LEVELS, NOISE_MEAN_LEVELS = 40.0, 0.5


@pytest.mark.parametrize("name", ["clip", "siglip", "dinov2"])
def test_matches_pil_processor_within_interpolation_tolerance(rng, name):
    _, cls, kwargs = PROCESSORS[name]
    processor = cls(**kwargs)
    spec = spec_from_image_processor(processor)
    to_levels = np.array(processor.image_std)[:, None, None] / processor.rescale_factor
    for images, max_levels, mean_levels in [
        (_gradients(rng), GRADIENT_MAX_LEVELS, GRADIENT_MEAN_LEVELS),
        (_noise(rng), NOISE_MAX_LEVELS, NOISE_MEAN_LEVELS),
    ]:
        levels = np.abs(preprocess(spec, images) - _hf(processor, images)) * to_levels
        assert levels.max() <= max_levels + 1e-3, f"seed={SEED} sizes={[im.size for im in images]}"
        assert levels.mean() <= mean_levels, f"seed={SEED} sizes={[im.size for im in images]}"


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_pil_and_torchvision_processors_give_the_same_spec(name):
    tv, pil, kwargs = PROCESSORS[name]
    assert spec_from_image_processor(pil(**kwargs)) == spec_from_image_processor(tv(**kwargs))


def test_clip_spec_format():
    spec = spec_from_image_processor(CLIPImageProcessor(**CLIP))
    assert spec == {
        "version": 1,
        "ops": [
            {"op": "convert_rgb"},
            {"op": "resize", "size": [56], "interpolation": "bicubic", "antialias": True},
            {"op": "center_crop", "size": [48, 48]},
            {"op": "rescale", "factor": 1 / 255},
            {"op": "normalize", "mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]},
        ],
        "output_size": [48, 48],
    }


@pytest.mark.parametrize("cls, kwargs", list(TORCHVISION_CASES.values()), ids=list(TORCHVISION_CASES))
def test_spec_survives_json_bit_exactly(cls, kwargs):
    spec = spec_from_image_processor(cls(**kwargs))
    # == on Python floats compares bits (no NaN or -0.0 here), and a tuple would not equal its json list.
    assert json.loads(json.dumps(spec, allow_nan=False)) == spec


class _CustomCLIP(CLIPImageProcessor):
    pass


UNSUPPORTED = {
    "unknown_class": (ConvNextImageProcessor, "ConvNextImageProcessor is not supported"),  # crop_pct resizing
    "subclass": (lambda: _CustomCLIP(**CLIP), "_CustomCLIP is not supported"),  # may override _preprocess
    "do_pad": (lambda: LlavaImageProcessor(**CLIP, do_pad=True), "do_pad"),
    "longest_edge": (lambda: CLIPImageProcessor(size={"shortest_edge": 30, "longest_edge": 40}), "longest_edge"),
    "box_resample": (lambda: SiglipImageProcessor(resample=Image.Resampling.BOX), "resample"),
    "variable_output_size": (lambda: CLIPImageProcessor(**CLIP, do_center_crop=False), "depends on the image"),
    "two_channel_mean": (lambda: SiglipImageProcessor(image_mean=[0.5, 0.5]), "image_mean has 2 values"),
}


@pytest.mark.parametrize("make, problem", list(UNSUPPORTED.values()), ids=list(UNSUPPORTED))
def test_unsupported_configuration_raises_user_error(make, problem):
    with pytest.raises(UserError, match=problem) as info:
        spec_from_image_processor(make())
    assert "\n" not in str(info.value)
