"""`mmtrt run --requests FILE.jsonl`: one request per line in, one result per request out, in input order."""

from __future__ import annotations

import json
from pathlib import Path

from mmtrt.errors import UserError
from mmtrt.runtime.batch import Request

FIELDS = {"image", "prompt", "max_new_tokens", "raw_prompt"}


def read_requests(path: Path) -> list[Request | str]:
    """Each non-empty line as a Request, or the one-line reason it is not one (the other lines still run)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read --requests {path} ({exc.strerror}); pass a JSON Lines file") from None
    return [_parse(line, number) for number, line in enumerate(lines, 1) if line.strip()]


def _parse(line: str, number: int) -> Request | str:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"line {number} is not JSON ({exc.msg}); write one object per line"
    if not isinstance(obj, dict) or not {"image", "prompt"} <= obj.keys() or obj.keys() - FIELDS:
        return f"line {number} needs the keys image and prompt (optional: max_new_tokens, raw_prompt), nothing else"
    limit = obj.get("max_new_tokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
        return f"line {number}: max_new_tokens must be an integer"
    return Request(obj["image"], str(obj["prompt"]), limit, bool(obj.get("raw_prompt", False)))
