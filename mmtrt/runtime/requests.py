"""`mmtrt run --requests FILE.jsonl`: one request per line in, one result per request out, in input order.

A line that is not a request (not UTF-8, not JSON, a field of the wrong type, text that is not text) is refused
alone, with its line number; every other line still runs. Image paths are relative to the file's folder, as in
the eval suites' and calibration's JSONL."""

from __future__ import annotations

import json
from pathlib import Path

from mmtrt.errors import UserError
from mmtrt.runtime.batch import Request
from mmtrt.runtime.prompt import is_text

KINDS = {"image": (str, "a string (the image's path)"), "prompt": (str, "a string"),
         "max_new_tokens": (int, "an integer"), "raw_prompt": (bool, "true or false")}


def read_requests(path: Path, max_new_tokens: int | None = None, raw_prompt: bool = False) -> list[Request | str]:
    """Each non-empty line as a Request, or the one-line reason it is not one. `max_new_tokens` and `raw_prompt`
    are the defaults of lines that do not give their own."""
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read --requests {path} ({exc.strerror}); pass a JSON Lines file") from None
    folder = Path(path).parent
    parsed = [_parse(line, number, folder, max_new_tokens, raw_prompt)
              for number, line in enumerate(lines, 1) if line.strip()]
    if not parsed:
        raise UserError(f"--requests {path} holds no requests; write one JSON object per line, e.g. "
                        '{"image": "cat.png", "prompt": "What is it?"}')
    return parsed


def _parse(raw: bytes, number: int, folder: Path, max_new_tokens: int | None, raw_prompt: bool) -> Request | str:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"line {number} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); save the " \
               "file as UTF-8"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"line {number} is not JSON ({exc.msg}); write one object per line"
    if not isinstance(obj, dict) or not {"image", "prompt"} <= obj.keys() or obj.keys() - KINDS.keys():
        return f"line {number} needs the keys image and prompt (optional: max_new_tokens, raw_prompt), nothing else"
    for key, value in obj.items():
        kind, what = KINDS[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"line {number}: {key} must be {what}, not {json.dumps(value)[:40]}"
        if kind is str and not is_text(value):
            return f"line {number}: {key} holds a lone surrogate ({_first_surrogate(value)}), which is not text; " \
                   "write it as one UTF-8 character"
    image = Path(obj["image"]) if Path(obj["image"]).is_absolute() else folder / obj["image"]
    return Request(str(image), obj["prompt"], obj.get("max_new_tokens", max_new_tokens),
                   obj.get("raw_prompt", raw_prompt))


def _first_surrogate(value: str) -> str:
    return next(f"\\u{ord(c):04x}" for c in value if 0xD800 <= ord(c) <= 0xDFFF)
