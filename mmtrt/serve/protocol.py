"""One request body, OpenAI's chat completion shape, for both endpoints (the OpenAI route and the Triton model).

The body is checked here and by the runtime before anything is queued, so a bad request is refused in one line
(HTTP 400) and never reaches the loop. Images are `data:` URIs, or paths of files inside the server's allow-list
folder (`--allow-images DIR`, given as a plain path or a `file://` URL; runtime/image_source.py), in `image_url` and
`image` parts alike; a web address is never fetched. `prepare` does all of it, on a thread of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mmtrt.errors import UserError
from mmtrt.runtime.batch import Request
from mmtrt.runtime.chat import chat_request
from mmtrt.runtime.image_source import ImageSource
from mmtrt.runtime.sampling import SamplingParams
from mmtrt.serve.limits import Limits

# OpenAI's fields, plus vLLM's top_k and repetition_penalty; others (tools, logprobs, n > 1, ...) are refused
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "repetition_penalty", "stop")
KNOWN_FIELDS = {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "user",
                *SAMPLING_FIELDS}


@dataclass(frozen=True)
class ChatCall:
    request: Request
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the token counts


def parse_body(raw: bytes | str, limits: Limits = Limits()) -> dict[str, Any]:
    limits.check_body(len(raw))
    try:
        body = json.loads(raw)
    except RecursionError:
        raise UserError("the request body is JSON nested too deep to read; send a chat completion body") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of more digits than Python reads
        raise UserError(f"the request body is not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(body, dict):
        raise UserError("the request body must be a JSON object with model and messages")
    return body


def prepare(pipe, model_name: str, raw: bytes, images: ImageSource, limits: Limits, triton: bool = False) -> ChatCall:
    """The checked call for a raw body (Triton's: `model` may be left out, `stream` is ignored)."""
    body = parse_body(raw, limits)
    if triton:
        body.setdefault("model", model_name)
        body.pop("stream", None)
    return chat_call(pipe, model_name, body, images, limits)


def chat_call(pipe, model_name: str, body: dict[str, Any], images: ImageSource, limits: Limits = Limits()
              ) -> ChatCall:
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
    return ChatCall(chat_request(pipe, body.get("messages"), sampling, images, limits.max_text_chars), stream,
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
