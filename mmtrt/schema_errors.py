"""Schema errors as a person reads them: each names its path (`passes[0].token_prune.methd`), what is wrong
there and what is allowed, so one run can list every problem of a recipe or config."""

from __future__ import annotations

import difflib
import re
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

# what pydantic's type errors expect, in the recipe's words
EXPECTED = {"int_type": "an integer", "int_parsing": "an integer", "float_type": "a number",
            "float_parsing": "a number", "bool_type": "true or false", "string_type": "text", "list_type": "a list",
            "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
            "none_required": "null"}
# pydantic adds a union member's tag to the location of its error: `keep.int`, `keep.function-after[...]`
UNION_TAGS = {"int", "float", "str", "bool", "none", "list", "dict", "bytes"}
NUMBER_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def validation_problems(err: ValidationError, root: type[BaseModel], prefix: str = "") -> list[str]:
    """One problem per wrong value or unknown key; a union's alternatives give one problem, not one each."""
    grouped: dict[tuple, list[dict[str, Any]]] = {}
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not _is_tag(p))
        grouped.setdefault((loc, e["type"] == "extra_forbidden"), []).append(e)
    problems = []
    for (loc, unknown), errors in grouped.items():
        if unknown:
            problems.append(_unknown_key(root, loc, prefix))
        else:
            where = path_text(prefix, loc)
            problems.append(f"{where}: {_wrong_value(errors)}" if where else _wrong_value(errors))
    return problems


def path_text(prefix: str, loc) -> str:
    """`passes[0].token_prune.keep` from a location tuple, after `prefix`."""
    text = prefix
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _is_tag(part) -> bool:
    """A union member's tag, or `[key]`: pydantic's mark that a mapping's key (not its value) is wrong."""
    return isinstance(part, str) and (part in UNION_TAGS or part == "[key]"
                                      or re.fullmatch(r"[\w-]+\[.*\]", part) is not None)


def _unknown_key(root: type[BaseModel], loc: tuple, prefix: str) -> str:
    allowed = allowed_keys(root, loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    where = path_text(prefix, loc[:-1]) or "the top level"
    return (f"{path_text(prefix, loc)}: unknown key '{loc[-1]}'{hint}; "
            f"allowed keys in {where}: {', '.join(allowed) or 'none'}")


def _wrong_value(errors: list[dict[str, Any]]) -> str:
    value = errors[0].get("input")
    expected = [EXPECTED[e["type"]] for e in errors if e["type"] in EXPECTED]
    if expected and len(expected) == len(errors):
        return f"expected {' or '.join(dict.fromkeys(expected))}, got {shown(value)}{_yaml_hint(value)}"
    messages = [e["msg"].removeprefix("Value error, ") for e in errors if e["type"] not in EXPECTED]
    text = " or ".join(dict.fromkeys(messages))
    if errors[0]["type"] in ("missing", "value_error", "assertion_error") or isinstance(value, dict):
        return text
    return f"{text}, got {shown(value)}{_yaml_hint(value)}"


def shown(value: Any, limit: int = 40) -> str:
    """A value as the recipe wrote it: `true`, `null`, `'16'`, `[1, 2]`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = "null" if value is None else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _yaml_hint(value: Any) -> str:
    """Why a number arrived as text: quotes, or YAML 1.1's exponent without a dot (`1e-4`)."""
    if not (isinstance(value, str) and NUMBER_TEXT.match(value.strip())):
        return ""
    if "." not in value and "e" in value.lower():
        return f" (YAML reads {value} as text: write {value.lower().replace('e', '.0e', 1)})"
    return " (text: write the number without quotes)"


def allowed_keys(root: type[BaseModel], loc: tuple) -> list[str]:
    """The keys of the mapping at `loc`, following fields, list items and optional mappings from `root`."""
    cls: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        model = _model_in(cls)
        if model is None or part not in model.model_fields:
            return []
        cls = model.model_fields[part].annotation
    model = _model_in(cls)
    return list(model.model_fields) if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class an annotation holds: itself, or inside `X | None` or `list[X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found:
            return found
    return None
