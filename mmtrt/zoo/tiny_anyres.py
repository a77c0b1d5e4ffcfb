"""Tiny any-resolution models with random weights from a fixed seed: a LLaVA-NeXT (CLIP + Llama) and a
LLaVA-OneVision (SigLIP + Qwen2, anyres_max pooling), for tests and benchmarks of those families.

Real transformers classes with their own processors (so they take the path a Hugging Face checkpoint takes), scaled
down: 32-pixel tiles of 8-pixel patches (16 tokens a tile) and grids of tiles shaped like the originals'.
"""

from __future__ import annotations

import torch
from transformers import (
    CLIPVisionConfig,
    GenerationConfig,
    LlamaConfig,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessor,
    LlavaNextProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessor,
    LlavaOnevisionProcessor,
    LlavaOnevisionVideoProcessor,
    Qwen2Config,
    SiglipVisionConfig,
)

from mmtrt.zoo.tiny_llava import IMAGE_TOKEN, SEED, byte_tokenizer

TILE, PATCH = 32, 8
# LLaVA-NeXT's grids (336-pixel tiles: 1x2, 2x1, 2x2, 1x3, 3x1) on 32-pixel tiles
NEXT_PINPOINTS = [[32, 64], [64, 32], [64, 64], [32, 96], [96, 32]]
# OneVision's grids go from 1x1 to 6x6 tiles; up to 4x4 here, enough for anyres_max_4 to pool
ONEVISION_PINPOINTS = [[TILE * r, TILE * c] for r in range(1, 5) for c in range(1, 5)]
ONEVISION_MAX = "anyres_max_4"
VIDEO_TOKEN = "<video>"


def _text(kind, tokenizer, hidden: int, layers: int, tie: bool):
    return kind(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.1,
                tie_word_embeddings=tie, bos_token_id=None)


def _vision(kind, hidden: int, layers: int):
    return kind(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                image_size=TILE, patch_size=PATCH)


def _generation(tokenizer) -> GenerationConfig:
    return GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False)


def describe_tiny_llava_next(hidden: int = 64, layers: int = 2, vision_hidden: int = 32, vision_layers: int = 2,
                             feature_layer: int | list[int] = -2):
    """Config, generation config and processor of a tiny LLaVA-NeXT: CLIP tower ([CLS] dropped), Llama LLM."""
    tokenizer = byte_tokenizer()
    config = LlavaNextConfig(
        vision_config=_vision(CLIPVisionConfig, vision_hidden, vision_layers),
        text_config=_text(LlamaConfig, tokenizer, hidden, layers, tie=False),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), image_grid_pinpoints=NEXT_PINPOINTS,
        vision_feature_layer=feature_layer, vision_feature_select_strategy="default", tie_word_embeddings=False)
    image_processor = LlavaNextImageProcessor(size={"shortest_edge": TILE}, crop_size={"height": TILE, "width": TILE},
                                              image_grid_pinpoints=NEXT_PINPOINTS)
    processor = LlavaNextProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH,
                                   vision_feature_select_strategy="default", chat_template=tokenizer.chat_template,
                                   image_token=IMAGE_TOKEN, num_additional_image_tokens=1)
    return config, _generation(tokenizer), processor


def describe_tiny_llava_onevision(hidden: int = 64, layers: int = 2, vision_hidden: int = 32, vision_layers: int = 2,
                                  feature_layer: int | list[int] = (-2, -1)):
    """Config, generation config and processor of a tiny LLaVA-OneVision: SigLIP tower, Qwen2 LLM with tied
    embeddings (as the 0.5B model), anyres_max pooling; its projector reads the last two hidden states
    concatenated (a vision_feature_layer list, which OneVision-style configs allow)."""
    tokenizer = byte_tokenizer(extra=[VIDEO_TOKEN])
    config = LlavaOnevisionConfig(
        vision_config=_vision(SiglipVisionConfig, vision_hidden, vision_layers),
        text_config=_text(Qwen2Config, tokenizer, hidden, layers, tie=True),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        video_token_index=tokenizer.convert_tokens_to_ids(VIDEO_TOKEN), image_grid_pinpoints=ONEVISION_PINPOINTS,
        vision_aspect_ratio=ONEVISION_MAX, vision_feature_select_strategy="full",
        vision_feature_layer=feature_layer if isinstance(feature_layer, int) else list(feature_layer),
        tie_word_embeddings=True)
    image_processor = LlavaOnevisionImageProcessor(size={"height": TILE, "width": TILE},
                                                   image_grid_pinpoints=ONEVISION_PINPOINTS)
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor, tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(size={"height": TILE, "width": TILE}), num_image_tokens=(TILE // PATCH) ** 2,
        vision_feature_select_strategy="full", chat_template=tokenizer.chat_template, image_token=IMAGE_TOKEN,
        video_token=VIDEO_TOKEN, vision_aspect_ratio=ONEVISION_MAX)
    return config, _generation(tokenizer), processor


def _build(model_class, described, seed: int):
    config, generation, processor = described
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config).eval()
        with torch.no_grad():  # transformers zeroes biases; drawn ones make a dropped bias show (Qwen2's q/k/v)
            for module in model.modules():
                if isinstance(module, torch.nn.Linear) and module.bias is not None:
                    module.bias.normal_(0, 0.1)
    model.generation_config = generation
    return model, processor


def build_tiny_llava_next(seed: int = SEED, **sizes):
    return _build(LlavaNextForConditionalGeneration, describe_tiny_llava_next(**sizes), seed)


def build_tiny_llava_onevision(seed: int = SEED, **sizes):
    return _build(LlavaOnevisionForConditionalGeneration, describe_tiny_llava_onevision(**sizes), seed)
