"""docs/RECIPES.md, generated from the recipe schema and the registered passes so it cannot drift."""

from __future__ import annotations

import typing

import sys

from pydantic import BaseModel

from mmtrt.pipeline.registry import registered_passes
from mmtrt.recipe import Recipe

HEADER = """# Recipe reference

Generated from the schema by `make docs` (`python -m mmtrt.docgen`); a test checks it is current. Every key is
optional unless marked required. An unknown key anywhere, or a value of the wrong type (`true` where a number
belongs, `"16"` in quotes), is an error that names its path (`passes[0].token_prune.keep`) and what is allowed
there; `mmtrt compile --plan` lists every such problem at once. `model.path` may be relative to the recipe file.
Each pass has a page of its own in `docs/passes/`.

Minimal recipes:

```yaml
model: {source: zoo, name: tiny-llava}
```
```yaml
model: {source: hf, path: /path/to/a/saved/LlavaForConditionalGeneration}
```
"""


def _type_name(annotation) -> str:
    if isinstance(annotation, type):
        return "mapping" if issubclass(annotation, BaseModel) else annotation.__name__
    if _mapping(annotation):
        return "mapping or None"
    if typing.get_origin(annotation) is typing.Union:  # one that holds a Literal prints as Union[...]
        return " or ".join("None" if a is type(None) else _type_name(a) for a in typing.get_args(annotation))
    return str(annotation).replace("typing.", "").replace("|", "or")


def _mapping(annotation) -> type[BaseModel] | None:
    """The options class of a field that is one (`X`) or may be one (`X | None`)."""
    args = typing.get_args(annotation) if type(None) in typing.get_args(annotation) else (annotation,)
    options = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    return options[0] if options else None


def _section(model: type[BaseModel], prefix: str) -> list[str]:
    rows, nested = [], []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        default = "required" if field.is_required() else f"`{_default(field.default)}`"
        rows.append(f"| `{key}` | {_type_name(field.annotation)} | {default} | {field.description or ''} |")
        if _mapping(field.annotation):
            nested.append((_mapping(field.annotation), f"{key}."))
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |", *rows, ""]
    for cls, sub in nested:
        lines += [f"### `{sub[:-1]}`", "", *_section(cls, sub)]
    return lines


def _default(value) -> str:
    return value.model_dump() if isinstance(value, BaseModel) else value


def _passes() -> list[str]:
    lines = ["## Passes", "", "Each entry of `passes` is a one-key mapping from a pass name to its config.", ""]
    for name, cls in registered_passes().items():
        doc = (sys.modules[cls.__module__].__doc__ or "").strip()
        lines += [f"### `{name}`", "", doc.split("\n\n")[0].split(": ", 1)[-1], "",
                  f"Components: {', '.join(cls.components)}. Lossy: {'yes' if cls.lossy else 'no'}. "
                  f"Requires: {', '.join(sorted(cls.requires)) or 'nothing'}.", ""]
        if cls.Config.model_fields:
            lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
            lines += [f"| `{k}` | {_type_name(f.annotation)} | {'required' if f.is_required() else f'`{f.default}`'} | "
                      f"{f.description or ''} |"
                      for k, f in cls.Config.model_fields.items()]
            lines.append("")
    return lines


def render() -> str:
    return "\n".join([HEADER, "## Top level", "", *_section(Recipe, ""), *_passes()])


if __name__ == "__main__":
    print(render(), end="")
