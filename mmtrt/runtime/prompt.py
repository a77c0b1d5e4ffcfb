"""Prompt formatting as transformers users get it: chat template, then each image placeholder expanded.

The tokenizer is the runtime's BundleTokenizer or, at compile time, a transformers one: both take these calls."""

from __future__ import annotations

from mmtrt.errors import UserError


def format_prompt(tokenizer, chat_template: str, prompt: str, raw: bool, images: int = 1) -> str:
    """One user message holding the images then the text, with the generation prompt, as
    `processor.apply_chat_template` renders it."""
    if raw:
        return prompt
    messages = [{"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": prompt}]}]
    return tokenizer.apply_chat_template(messages, chat_template=chat_template, add_generation_prompt=True,
                                         tokenize=False)


def tokenize(tokenizer, text: str, image_token: str, tokens_per_image: int, images: int = 1) -> list[int]:
    """Expand each image placeholder to the bundle's image-token count and tokenize as LlavaProcessor does."""
    count = text.count(image_token)
    if count != images:
        need, where = (("with one image it needs exactly one", "the image") if images == 1
                       else (f"it needs one per image, {images}", "each image"))
        raise UserError(f"the prompt holds {count} {image_token} placeholders; {need} "
                        f"(with --raw-prompt, put {image_token} where {where} goes)")
    expanded = text.replace(image_token, image_token * tokens_per_image)
    bos = tokenizer.bos_token
    return tokenizer(expanded, add_special_tokens=not (bos and expanded.startswith(bos)))["input_ids"]
