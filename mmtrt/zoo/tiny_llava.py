"""`zoo:tiny-llava`: a small LLaVA with random weights from a fixed seed, for fast end-to-end tests.

It is a real `LlavaForConditionalGeneration` with a processor and an offline byte-level tokenizer, so it takes
exactly the path a Hugging Face checkpoint takes. Weights are drawn wider than usual so that greedy decoding
has logit margins far above float error.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    GemmaConfig,
    GenerationConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    MistralConfig,
    PreTrainedTokenizerFast,
    SiglipImageProcessor,
    SiglipVisionConfig,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

SEED = 1234
IMAGE_TOKEN = "<image>"
SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", IMAGE_TOKEN, "<pad>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>\n"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# Mistral's and Gemma's templates write the BOS token themselves, and their tokenizers add one too: the case
# where formatting code must not add a second BOS.
BOS = "<s>"
BOS_TEMPLATE = "{{ bos_token }}" + CHAT_TEMPLATE
LLM_CONFIGS = {"llama": LlamaConfig, "mistral": MistralConfig, "gemma": GemmaConfig}


def byte_tokenizer(bos: bool = False, extra: list[str] = ()) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with no merges: 256 byte tokens and the chat's special tokens (and `extra` ones),
    built offline. With `bos`, it prepends a BOS token as Mistral's and Gemma's tokenizers do, and its template
    writes one."""
    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS + list(extra) + ([BOS] if bos else []))
    if bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                           special_tokens=[(BOS, tok.token_to_id(BOS))])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        bos_token=BOS if bos else None,
        extra_special_tokens={"image_token": IMAGE_TOKEN},
        chat_template=BOS_TEMPLATE if bos else CHAT_TEMPLATE,
    )


def _vision(tower: str, image_size: int, patch_size: int, hidden: int, layers: int):
    common = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, image_size=image_size, patch_size=patch_size)
    if tower == "clip":
        return CLIPVisionConfig(projection_dim=hidden, **common), CLIPImageProcessor(
            size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size})
    if tower == "siglip":
        return SiglipVisionConfig(**common), SiglipImageProcessor(size={"height": image_size, "width": image_size})
    raise ValueError(f"unknown tower {tower!r}")


def describe_tiny_llava(
    tower: str = "clip",
    image_size: int = 64,
    patch_size: int = 8,
    vision_hidden: int = 64,
    vision_layers: int = 4,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    llm: str = "llama",
    head_dim: int | None = None,
    feature_layer: int | list[int] = -2,
) -> tuple[LlavaConfig, GenerationConfig, LlavaProcessor]:
    """The config, generation config and processor, without weights. `llm` picks the decoder family (llama,
    mistral or gemma: the latter two with a BOS-writing template); `head_dim` may differ from hidden / heads,
    as Gemma's does; `feature_layer` is LLaVA's vision_feature_layer (a list concatenates those layers)."""
    tokenizer = byte_tokenizer(bos=llm != "llama")
    vision_config, image_processor = _vision(tower, image_size, patch_size, vision_hidden, vision_layers)
    text_config = LLM_CONFIGS[llm](
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048,
        initializer_range=0.1, tie_word_embeddings=False, head_dim=head_dim or hidden // heads,
        bos_token_id=tokenizer.bos_token_id,
    )
    strategy = "default" if tower == "clip" else "full"
    config = LlavaConfig(
        vision_config=vision_config, text_config=text_config,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=feature_layer, vision_feature_select_strategy=strategy, projector_hidden_act="gelu",
    )
    generation = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                  do_sample=False)
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size,
        vision_feature_select_strategy=strategy, chat_template=tokenizer.chat_template, image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1 if tower == "clip" else 0,
    )
    return config, generation, processor


def build_tiny_llava(seed: int = SEED, **sizes) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """The model and its processor (`describe_tiny_llava`'s arguments); the same arguments always give the same
    weights."""
    config, generation, processor = describe_tiny_llava(**sizes)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config).eval()
    model.generation_config = generation
    return model, processor
