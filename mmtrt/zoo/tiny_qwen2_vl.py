"""Small Qwen2-VL and Qwen2.5-VL models with random weights from a fixed seed, for tests and benchmarks.

Real `Qwen2VLForConditionalGeneration` / `Qwen2_5_VLForConditionalGeneration` with Qwen2VLProcessor's image
processor and an offline byte-level tokenizer carrying Qwen's vision tokens and chat layout, so a saved one takes
exactly the path a Hugging Face checkpoint takes. The pixel range is small (4 to 20 image tokens by default) so
that the smallest and the largest image the envelope allows are cheap to run.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

SEED = 4321
IMAGE_TOKEN = "<|image_pad|>"
SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", IMAGE_TOKEN, "<|video_pad|>",
                  "<|endoftext|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FAMILIES = {
    "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor),
    "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor),
}


def qwen_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)


def _vision(family: str, hidden: int) -> dict:
    common = dict(depth=2, num_heads=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                  initializer_range=0.1)
    if family == "qwen2_vl":
        return dict(embed_dim=32, hidden_size=hidden, mlp_ratio=2, **common)
    # windows of 2x2 merge blocks (56 px); layer 0 attends within windows, layer 1 over the whole image
    return dict(hidden_size=32, intermediate_size=64, out_hidden_size=hidden, window_size=56,
                fullatt_block_indexes=[1], **common)


def build_tiny_qwen2_vl(family: str = "qwen2_vl", seed: int = SEED, min_tokens: int = 4, max_tokens: int = 20,
                        hidden: int = 64):
    """The model and its processor; the same arguments always give the same weights. The processor's pixel range
    is min_tokens..max_tokens blocks of 28 x 28. The LLM has 4 heads of hidden / 4 (vLLM's CPU attention needs
    heads of 32: hidden 128), its M-RoPE sections in Qwen2-VL's proportions (16, 24, 24 of 64 frequencies)."""
    config_class, model_class, processor_class = FAMILIES[family]
    tokenizer = qwen_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    half = hidden // 8  # rotary frequencies per head
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                rope_parameters={"rope_type": "default", "mrope_section": [half // 4, 3 * half // 8, 3 * half // 8],
                                 "rope_theta": 10000.0},
                initializer_range=0.1, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    config = config_class(text_config=text, vision_config=_vision(family, hidden),
                          image_token_id=ids[IMAGE_TOKEN], video_token_id=ids["<|video_pad|>"],
                          vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config).eval()
        with torch.no_grad():  # transformers zeroes biases; drawn ones make a dropped bias show (q/k/v, vision)
            for module in model.modules():
                if isinstance(module, torch.nn.Linear) and module.bias is not None:
                    module.bias.normal_(0, 0.1)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=False)
    images = Qwen2VLImageProcessor(min_pixels=min_tokens * 28 * 28, max_pixels=max_tokens * 28 * 28)
    processor = processor_class(image_processor=images, tokenizer=tokenizer, video_processor=Qwen2VLVideoProcessor(),
                                chat_template=CHAT_TEMPLATE)
    return model, processor
