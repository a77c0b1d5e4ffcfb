"""Prompt formatting as transformers users get it: chat template, then each image placeholder expanded.

The tokenizer is the runtime's BundleTokenizer or, at compile time, a transformers one: both take these calls.

Special tokens a user types (`<|im_end|>`, `<image>`) are text by default: the user's text is tokenized with
special tokens split, as transformers' `split_special_tokens=True` does, so a prompt cannot forge a turn of the
conversation or a second image. A prompt without special tokens gives the same ids either way. `--raw-prompt`
text is the caller's own template, so its special tokens are parsed, and so are a prompt's where the caller loads
with `parse_special_tokens=True` (transformers' and vLLM's default for text they render)."""

from __future__ import annotations

import jinja2

from mmtrt.errors import UserError


def format_prompt(tokenizer, chat_template: str, prompt: str, raw: bool, images: int = 1) -> str:
    """One user message holding the images then the text, with the generation prompt, as
    `processor.apply_chat_template` renders it."""
    if raw:
        return prompt
    messages = [{"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": prompt}]}]
    try:
        return tokenizer.apply_chat_template(messages, chat_template=chat_template, add_generation_prompt=True,
                                             tokenize=False)
    except jinja2.TemplateError as exc:
        problem = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UserError(f"the bundle's chat template does not render ({problem}); restore the bundle from its "
                        "source or recompile it") from None


def tokenize(tokenizer, text: str, image_token: str, tokens_per_image: int, images: int = 1) -> list[int]:
    """Expand each image placeholder to the bundle's image-token count and tokenize as LlavaProcessor does."""
    count = text.count(image_token)
    if count != images:
        need, where = (("with one image it needs exactly one", "the image") if images == 1
                       else (f"it needs one per image, {images}", "each image"))
        raise UserError(f"the prompt holds {count} {image_token} placeholders; {need} "
                        f"(with --raw-prompt, put {image_token} where {where} goes)")
    bos = tokenizer.bos_token
    return expanded_ids(tokenizer, text, image_token, tokens_per_image, not (bos and text.startswith(bos)))


def expanded_ids(tokenizer, text: str, image_token: str, tokens_per_image: int, add_special_tokens: bool
                 ) -> list[int]:
    """The ids of `text` with each image placeholder expanded to `tokens_per_image` of them. Where the placeholder
    is an added token, the text around it is tokenized apart from it, so its id is repeated after tokenizing: the
    expanded text's ids without tokenizing thousands of placeholders (7 ms of a repeated request's 55)."""
    placeholder = next((i for i, t in tokenizer.added_tokens_decoder.items() if t.content == image_token), None)
    if placeholder is None:
        expanded = text.replace(image_token, image_token * tokens_per_image)
        return tokenizer(expanded, add_special_tokens=add_special_tokens)["input_ids"]
    ids = []
    for i in tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]:
        ids += [i] * tokens_per_image if i == placeholder else [i]
    return ids


SENTINEL = "\ue000mmtrt-user-text\ue000"  # a private-use character: no template or tokenizer gives it meaning


def tokenize_user_text(tokenizer, chat_template: str, prompt: str, image_token: str, tokens_per_image: int,
                       images: int = 1) -> list[int]:
    """The template's text with its special tokens parsed, the user's text between with them split."""
    framed = format_prompt(tokenizer, chat_template, SENTINEL, raw=False, images=images)
    if framed.count(SENTINEL) != 1:
        raise UserError("the prompt holds special tokens and this bundle's chat template alters the user's text, so "
                        "they cannot be kept as text; remove them, or load with parse_special_tokens=True")
    count = framed.count(image_token)
    if count != images:
        raise UserError(f"the chat template holds {count} {image_token} placeholders for {images} image(s); it needs "
                        "one per image; recompile the recipe")
    before, after = framed.split(SENTINEL)
    bos = tokenizer.bos_token
    head = expanded_ids(tokenizer, before, image_token, tokens_per_image, not (bos and before.startswith(bos)))
    text = tokenizer(prompt, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return head + text + (expanded_ids(tokenizer, after, image_token, tokens_per_image, False) if after else [])


def tokenize_spans(tokenizer, text: str, spans, image_token: str, tokens_per_image: int, images: int = 1
                   ) -> list[int]:
    """A rendered conversation's ids: the template's text with its special tokens parsed and each image
    placeholder expanded, the `spans` of the messages' own text between with special tokens split."""
    pieces, at = [], 0
    for start, end in spans:
        pieces += [(text[at:start], False), (text[start:end], True)]
        at = end
    pieces.append((text[at:], False))
    count = sum(piece.count(image_token) for piece, user in pieces if not user)
    if count != images:
        raise UserError(f"the chat template renders {count} {image_token} placeholders for {images} image(s); it "
                        "needs one per image")
    bos, ids = tokenizer.bos_token, []
    for i, (piece, user) in enumerate(pieces):
        if user:
            ids += tokenizer(piece, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        elif piece or i == 0:
            first = i == 0 and not (bos and piece.startswith(bos))
            ids += expanded_ids(tokenizer, piece, image_token, tokens_per_image, first)
    return ids


def holds_special_tokens(tokenizer, text: str) -> bool:
    """Whether `text` holds a special added token's text (BundleTokenizer and transformers' tokenizers alike)."""
    return any(t.special and t.content in text for t in tokenizer.added_tokens_decoder.values())


def is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_prompt(prompt) -> None:
    """A prompt the tokenizer can take: text, encodable as UTF-8 (an argument of bytes that are not UTF-8 reaches
    Python as lone surrogates)."""
    if not isinstance(prompt, str):
        raise UserError(f"the prompt must be text, not {type(prompt).__name__}; pass a string")
    if not is_text(prompt):
        raise UserError("the prompt is not valid UTF-8 text (a lone surrogate or a byte that is not UTF-8); "
                        "re-encode it as UTF-8")
