"""One request body, OpenAI's chat completion shape, for both endpoints (the OpenAI route and the Triton model).

The body is checked here and by the runtime before anything is queued, so a bad request is refused in one line
(HTTP 400) and never reaches the loop. Images are `data:` URIs, or paths of files inside the server's allow-list
folder (`--allow-images DIR`, given as a plain path or a `file://` URL); a web address is never fetched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from mmtrt.errors import UserError
from mmtrt.runtime.batch import Request
from mmtrt.runtime.chat import chat_request, load_data_uri
from mmtrt.runtime.image_file import open_image
from mmtrt.runtime.sampling import SamplingParams

# OpenAI's fields, plus vLLM's top_k and repetition_penalty; others (tools, logprobs, n > 1, ...) are refused
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "repetition_penalty", "stop")
KNOWN_FIELDS = {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "user",
                *SAMPLING_FIELDS}


@dataclass(frozen=True)
class ChatCall:
    request: Request
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the token counts


class ImageSource:
    """Opens the image_url of a message part: a `data:` URI, or a file inside `allowed` (None: no files)."""

    def __init__(self, allowed: Path | None):
        self.allowed = allowed.resolve() if allowed else None

    def __call__(self, url: str):
        if url.startswith("data:"):
            return load_data_uri(url)
        parsed = urlparse(url)
        if parsed.scheme not in ("", "file"):
            raise UserError(f"image url {url[:60]!r} is refused: this server reads data: URIs and files in its "
                            "allow-list folder only, and never fetches web addresses")
        if self.allowed is None:
            raise UserError("image files are refused: this server was started without --allow-images; send the "
                            "image as a data:image/png;base64,... URI")
        path = Path(unquote(parsed.path) if parsed.scheme == "file" else url).resolve()
        if not path.is_relative_to(self.allowed):
            raise UserError(f"image {url[:60]!r} is outside the allowed folder {self.allowed}; move it there or send "
                            "it as a data: URI")
        return open_image(path, f"{url[:60]!r}")


def parse_body(raw: bytes | str) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"the request body is not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(body, dict):
        raise UserError("the request body must be a JSON object with model and messages")
    return body


def chat_call(pipe, model_name: str, body: dict[str, Any], images: ImageSource) -> ChatCall:
    """The runtime request for an OpenAI chat completion body; UserError names the first problem."""
    unknown = sorted(set(body) - KNOWN_FIELDS)
    if unknown:
        raise UserError(f"field {unknown[0]!r} is not supported; the fields are {', '.join(sorted(KNOWN_FIELDS))}")
    if body.get("model") != model_name:
        raise UserError(f"model {body.get('model')!r} is not served here; this server serves {model_name!r}")
    if body.get("n", 1) != 1:
        raise UserError(f"n {body.get('n')!r} is not supported; ask for one choice (n: 1)")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise UserError(f"stream {stream!r} must be true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise UserError("stream_options must be an object such as {\"include_usage\": true}")
    sampling = sampling_params(body)
    return ChatCall(chat_request(pipe, body.get("messages"), sampling, images), stream,
                    bool(options.get("include_usage")))


def sampling_params(body: dict[str, Any]) -> SamplingParams:
    """OpenAI's names to vLLM's: max_completion_tokens (or the older max_tokens) is max_new_tokens; null is the
    default. The values are checked by the runtime (SamplingParams.validate)."""
    given = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    max_new = body.get("max_completion_tokens", body.get("max_tokens"))
    if "stop" in given and not isinstance(given["stop"], (str, list)):
        raise UserError(f"stop {given['stop']!r} must be a string or a list of strings")
    try:
        return SamplingParams(max_new_tokens=max_new, **given)
    except TypeError as exc:
        raise UserError(f"the sampling fields are malformed ({exc})") from None
