"""The architectures of real VLMs (configs as their Hub pages give them) with mmtrt's byte tokenizer, for
random-weight checkpoints (`scripts/random_checkpoint.py`). `layers` overrides the depths for a cheaper trial."""

from __future__ import annotations

from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    GenerationConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessor,
    LlavaOnevisionProcessor,
    LlavaOnevisionVideoProcessor,
    LlavaProcessor,
    Qwen2Config,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
    SiglipImageProcessor,
    SiglipVisionConfig,
)

from mmtrt.zoo.tiny_anyres import VIDEO_TOKEN
from mmtrt.zoo.tiny_llava import IMAGE_TOKEN, byte_tokenizer
from mmtrt.zoo.tiny_qwen2_vl import IMAGE_TOKEN as QWEN_IMAGE_TOKEN
from mmtrt.zoo.tiny_qwen2_vl import qwen_tokenizer


def _generation(tokenizer) -> GenerationConfig:
    return GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False)


def onevision_05b(layers: tuple[int, int] | None = None, vocab: int = 151936):
    """llava-hf/llava-onevision-qwen2-0.5b-ov-hf: SigLIP so400m/14 at 384 (26 layers), Qwen2-0.5B (24 layers)."""
    vision_layers, text_layers = layers or (26, 24)
    tokenizer = byte_tokenizer(extra=[VIDEO_TOKEN])
    pinpoints = [[384 * r, 384 * c] for r in range(1, 7) for c in range(1, 7)]
    config = LlavaOnevisionConfig(
        vision_config=SiglipVisionConfig(hidden_size=1152, intermediate_size=4304, num_hidden_layers=vision_layers,
                                         num_attention_heads=16, image_size=384, patch_size=14),
        text_config=Qwen2Config(vocab_size=vocab, hidden_size=896, intermediate_size=4864,
                                num_hidden_layers=text_layers, num_attention_heads=14, num_key_value_heads=2,
                                max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        video_token_index=tokenizer.convert_tokens_to_ids(VIDEO_TOKEN), image_grid_pinpoints=pinpoints,
        vision_aspect_ratio="anyres_max_9", vision_feature_select_strategy="full", vision_feature_layer=-1,
        tie_word_embeddings=True)
    size = {"height": 384, "width": 384}
    processor = LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(size=size, image_grid_pinpoints=pinpoints,
                                                     image_mean=[0.5] * 3, image_std=[0.5] * 3),
        tokenizer=tokenizer, video_processor=LlavaOnevisionVideoProcessor(size=size), num_image_tokens=729,
        vision_feature_select_strategy="full", chat_template=tokenizer.chat_template, image_token=IMAGE_TOKEN,
        video_token=VIDEO_TOKEN, vision_aspect_ratio="anyres_max_9")
    return LlavaOnevisionForConditionalGeneration, config, processor, _generation(tokenizer)


def llava15_7b(layers: tuple[int, int] | None = None, vocab: int = 32064):
    """llava-hf/llava-1.5-7b-hf: CLIP ViT-L/14 at 336 (24 layers, feature layer -2), Llama-2-7B (32 layers)."""
    vision_layers, text_layers = layers or (24, 32)
    tokenizer = byte_tokenizer()
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=vision_layers,
                                       num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768),
        text_config=LlamaConfig(vocab_size=vocab, hidden_size=4096, intermediate_size=11008,
                                num_hidden_layers=text_layers, num_attention_heads=32, num_key_value_heads=32,
                                max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                bos_token_id=None),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), vision_feature_layer=-2,
        vision_feature_select_strategy="default", projector_hidden_act="gelu", tie_word_embeddings=False)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                               vision_feature_select_strategy="default", chat_template=tokenizer.chat_template,
                               image_token=IMAGE_TOKEN, num_additional_image_tokens=1)
    return LlavaForConditionalGeneration, config, processor, _generation(tokenizer)


def qwen2_vl_2b(layers: tuple[int, int] | None = None, vocab: int = 151936):
    """Qwen/Qwen2-VL-2B-Instruct: a 32-layer ViT (embed 1280) with a 2x2 merger, Qwen2-1.5B (28 layers), M-RoPE."""
    vision_layers, text_layers = layers or (32, 28)
    tokenizer = qwen_tokenizer()
    config = Qwen2VLConfig(
        vision_config={"depth": vision_layers, "embed_dim": 1280, "hidden_size": 1536, "mlp_ratio": 4, "num_heads": 16,
                           "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3},
        text_config={"vocab_size": vocab, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": text_layers,
                         "num_attention_heads": 12, "num_key_value_heads": 2, "max_position_embeddings": 32768,
                         "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                         "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                          "mrope_section": [16, 24, 24]}},
        image_token_id=tokenizer.convert_tokens_to_ids(QWEN_IMAGE_TOKEN),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"), tie_word_embeddings=True)
    pixels = {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(size=pixels), tokenizer=tokenizer,
                                 video_processor=Qwen2VLVideoProcessor(), chat_template=tokenizer.chat_template)
    return Qwen2VLForConditionalGeneration, config, processor, _generation(tokenizer)


def smollm_llava(layers: tuple[int, int] | None = None, vocab: int = 49152):
    """zoo:dino-smollm-page's sizes with a tower vLLM's LLaVA takes: a SigLIP of DINOv2 ViT-S/14's size at 224 (12
    layers, 256 image tokens) and SmolLM2-135M (30 layers, hidden 576, 9 heads of 64, 3 KV heads, tied embeddings)."""
    vision_layers, text_layers = layers or (12, 30)
    tokenizer = byte_tokenizer()
    config = LlavaConfig(
        vision_config=SiglipVisionConfig(hidden_size=384, intermediate_size=1536, num_hidden_layers=vision_layers,
                                         num_attention_heads=6, image_size=224, patch_size=14),
        text_config=LlamaConfig(vocab_size=vocab, hidden_size=576, intermediate_size=1536,
                                num_hidden_layers=text_layers, num_attention_heads=9, num_key_value_heads=3,
                                max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
                                rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, bos_token_id=None),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN), vision_feature_layer=-1,
        vision_feature_select_strategy="full", projector_hidden_act="gelu", tie_word_embeddings=True)
    processor = LlavaProcessor(image_processor=SiglipImageProcessor(size={"height": 224, "width": 224}),
                               tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="full",
                               chat_template=tokenizer.chat_template, image_token=IMAGE_TOKEN,
                               num_additional_image_tokens=0)
    return LlavaForConditionalGeneration, config, processor, _generation(tokenizer)


MODELS = {"smollm-llava": smollm_llava, "onevision-0.5b": onevision_05b, "qwen2-vl-2b": qwen2_vl_2b, "llava-1.5-7b": llava15_7b}
