"""A conversation (OpenAI's chat messages) as one request: the bundle's chat template over every turn, the images
in the order their parts appear.

A message is `{"role": "system" | "user" | "assistant", "content": str | [part, ...]}`; a part is
`{"type": "text", "text": ...}`, `{"type": "image_url", "image_url": {"url": ...}}` (OpenAI's) or
`{"type": "image", "image": PIL image | path}` (the Python API's). The template sees image parts as
`{"type": "image"}`, as transformers' processors pass them, and renders one placeholder per image; a template
that renders another count, or raises, does not take that many images, and the request is refused in one line.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any, Callable

from jinja2.exceptions import TemplateError
from PIL import Image

from mmtrt.errors import UserError
from mmtrt.runtime.batch import Request
from mmtrt.runtime.image_file import open_image
from mmtrt.runtime.sampling import SamplingParams

ROLES = ("system", "user", "assistant")


def chat_request(pipe, messages: list[dict[str, Any]], sampling: SamplingParams | None = None,
                 load_image: Callable[[str], Any] | None = None) -> Request:
    """The request for `messages` on the loaded bundle `pipe`, its prompt rendered (raw_prompt=True).
    `load_image(url)` opens an image_url part (default: `data:` URIs only)."""
    turns, images = parse_messages(messages, load_image or load_data_uri)
    limit = pipe.dims.get("num_images", {}).get("max") or 1
    if len(images) > limit:
        raise UserError(f"the messages hold {len(images)} images; this bundle takes at most {limit} per request; "
                        "send fewer images")
    try:
        text = pipe.tokenizer.apply_chat_template(turns, chat_template=pipe.model["chat_template"],
                                                  add_generation_prompt=True)
    except TemplateError as exc:
        raise UserError(f"this model's chat template refuses the messages ({exc}); change the conversation") from None
    placeholder = pipe.model["image_token"]
    if text.count(placeholder) != len(images):
        raise UserError(f"this model's chat template renders {text.count(placeholder)} image placeholders for "
                        f"{len(images)} images; send {'one image' if len(images) > 1 else 'images only in content parts'}"
                        f" (and no literal {placeholder} in the text)")
    return Request(images, text, None, raw_prompt=True, sampling=sampling)


def parse_messages(messages: Any, load_image: Callable[[str], Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """The turns as the template takes them and the images in order; a malformed message is a UserError naming
    where it is."""
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
        parts = []
        for j, part in enumerate(content):
            parts.append(_part(part, f"{where}.content[{j}]", images, load_image))
        turns.append({"role": message["role"], "content": parts})
    return turns, images


def _part(part: Any, where: str, images: list[Any], load_image: Callable[[str], Any]) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "image_url":
        url = part.get("image_url", {}).get("url") if isinstance(part.get("image_url"), dict) else None
        if not isinstance(url, str):
            raise UserError(f"{where}: an image_url part needs image_url.url")
        images.append(load_image(url))
        return {"type": "image"}
    if kind == "image" and part.get("image") is not None:
        images.append(open_image(part["image"]))
        return {"type": "image"}
    raise UserError(f"{where}: a part is {{type: text, text}} or {{type: image_url, image_url: {{url}}}}")


def load_data_uri(url: str) -> Image.Image:
    """An image from a `data:image/...;base64,` URI; anything else (a file path, a web address) is refused."""
    if not url.startswith("data:"):
        raise UserError(f"image url {url[:40]!r} is not a data: URI; send the image inline as "
                        "data:image/png;base64,...")
    header, _, payload = url.partition(",")
    if not header.endswith(";base64"):
        raise UserError("an image data: URI must be base64 (data:image/png;base64,...)")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise UserError("the image data: URI is not valid base64") from None
    return open_image(io.BytesIO(raw), "the data: URI's image")
