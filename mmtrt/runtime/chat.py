"""A conversation (OpenAI's chat messages) as one request: the bundle's chat template over every turn, the images
in the order their parts appear.

A message is `{"role": "system" | "user" | "assistant", "content": str | [part, ...]}`; a part is
`{"type": "text", "text": ...}`, `{"type": "image_url", "image_url": {"url": ...}}` (OpenAI's) or
`{"type": "image", "image": PIL image | path}` (the Python API's; a server opens both kinds through its one
`ImageSource`). The template sees image parts as `{"type": "image"}`, as transformers' processors pass them, and
renders one placeholder per image; a template that renders another count, or raises, does not take that many
images, and the request is refused in one line. The messages' text is the client's: special tokens typed in it
stay text (see docs/security.md), as `tokenize_user_text` keeps a single prompt's.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from jinja2.exceptions import TemplateError
from PIL import Image

from mmtrt.errors import UserError
from mmtrt.runtime.batch import Request
from mmtrt.runtime.image_file import open_image
from mmtrt.runtime.image_source import load_data_uri
from mmtrt.runtime.prompt import holds_special_tokens
from mmtrt.runtime.sampling import SamplingParams

ROLES = ("system", "user", "assistant")
MARK = re.compile("\ue000([0-9]+)\ue001")  # private-use characters: no template or tokenizer gives them meaning


def chat_request(pipe, messages: list[dict[str, Any]], sampling: SamplingParams | None = None,
                 load_image: Callable[[Any], Any] | None = None, max_text_chars: int | None = None) -> Request:
    """The request for `messages` on the loaded bundle `pipe`, its prompt rendered (raw_prompt=True) with the
    messages' text kept as text (`text_spans`) unless `pipe.parse_special_tokens`. `load_image(value)` opens every
    image part (default: a PIL image or a path for `image` parts, `data:` URIs for `image_url` ones); the images are
    counted, and the text measured against `max_text_chars`, before any is opened."""
    turns, pending = parse_messages(messages)
    limit = pipe.dims.get("num_images", {}).get("max") or 1
    if len(pending) > limit:
        raise UserError(f"the messages hold {len(pending)} images; this bundle takes at most {limit} per request; "
                        "send fewer images")
    texts = _texts(turns)
    if max_text_chars is not None and (chars := sum(map(len, texts))) > max_text_chars:
        raise UserError(f"the messages hold {chars} characters of text; this server takes at most {max_text_chars}; "
                        "shorten them")
    text, spans = render(pipe, turns, texts)
    placeholder = pipe.model["image_token"]
    rendered = _outside_spans(text, spans).count(placeholder)
    if rendered != len(pending):
        fix = "one image" if len(pending) > 1 else "images only in content parts"
        raise UserError(f"this model's chat template renders {rendered} image placeholders for {len(pending)} images; "
                        f"send {fix} (and no literal {placeholder} in the text)")
    images = [_open(kind, value, load_image) for kind, value in pending]
    return Request(images, text, None, raw_prompt=True, sampling=sampling, text_spans=spans)


def render(pipe, turns: list[dict[str, Any]], texts: list[str]) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The template's text, and where the messages' own text lies in it when special tokens in it must stay text
    (the template rendered over markers in place of each text, then the texts put back)."""
    plain = _apply(pipe, turns)
    if pipe.parse_special_tokens or not any(holds_special_tokens(pipe.tokenizer, t) for t in texts):
        return plain, ()
    marks = iter(range(len(texts)))
    framed = _apply(pipe, _map_texts(turns, lambda _: f"\ue000{next(marks)}\ue001"))
    pieces, spans, seen = [], [], []
    at = length = 0
    for m in MARK.finditer(framed):
        pieces.append(framed[at:m.start()])
        length += m.start() - at
        index = int(m.group(1))
        seen.append(index)
        pieces.append(texts[index] if index < len(texts) else "")
        spans.append((length, length + len(pieces[-1])))
        length += len(pieces[-1])
        at = m.end()
    pieces.append(framed[at:])
    if sorted(seen) != list(range(len(texts))) or "".join(pieces) != plain:
        raise UserError("the messages hold special tokens and this model's chat template alters the text it is "
                        "given, so they cannot be kept as text; remove them (or serve with --parse-special-tokens)")
    return plain, tuple((a, b) for a, b in spans if b > a)


def _apply(pipe, turns: list[dict[str, Any]]) -> str:
    try:
        return pipe.tokenizer.apply_chat_template(turns, chat_template=pipe.model["chat_template"],
                                                  add_generation_prompt=True)
    except TemplateError as exc:
        raise UserError(f"this model's chat template refuses the messages ({exc}); change the conversation") from None


def _texts(turns: list[dict[str, Any]]) -> list[str]:
    texts: list[str] = []
    _map_texts(turns, lambda t: texts.append(t) or t)
    return texts


def _map_texts(turns: list[dict[str, Any]], change: Callable[[str], str]) -> list[dict[str, Any]]:
    """The turns with every text (a string content, a text part's text) replaced by `change(text)`, in order."""
    out = []
    for turn in turns:
        content = turn["content"]
        if isinstance(content, str):
            out.append({**turn, "content": change(content)})
        else:
            out.append({**turn, "content": [{**p, "text": change(p["text"])} if p["type"] == "text" else p
                                            for p in content]})
    return out


def _outside_spans(text: str, spans: tuple[tuple[int, int], ...]) -> str:
    at, kept = 0, []
    for start, end in spans:
        kept.append(text[at:start])
        at = end
    return "".join(kept) + text[at:]


def parse_messages(messages: Any) -> tuple[list[dict[str, Any]], list[tuple[str, Any]]]:
    """The turns as the template takes them and each image part's (type, value) in order, none opened; a malformed
    message is a UserError naming where it is."""
    if not isinstance(messages, list) or not messages:
        raise UserError("messages must be a non-empty list of {role, content} objects")
    turns, images = [], []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES or "content" not in message:
            raise UserError(f"{where} needs a role ({', '.join(ROLES)}) and a content")
        content = message["content"]
        if isinstance(content, str):
            turns.append({"role": message["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise UserError(f"{where}.content must be a string or a list of parts")
        turns.append({"role": message["role"],
                      "content": [_part(part, f"{where}.content[{j}]", images) for j, part in enumerate(content)]})
    return turns, images


def _part(part: Any, where: str, images: list[tuple[str, Any]]) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "image_url":
        url = part.get("image_url", {}).get("url") if isinstance(part.get("image_url"), dict) else None
        if not isinstance(url, str):
            raise UserError(f"{where}: an image_url part needs image_url.url")
        images.append((kind, url))
        return {"type": "image"}
    if kind == "image" and part.get("image") is not None:
        images.append((kind, part["image"]))
        return {"type": "image"}
    raise UserError(f"{where}: a part is {{type: text, text}} or {{type: image_url, image_url: {{url}}}}")


def _open(kind: str, value: Any, load_image: Callable[[Any], Any] | None):
    if isinstance(value, Image.Image):
        return value
    if load_image is not None:
        return load_image(value)
    return open_image(value) if kind == "image" else load_data_uri(value)
