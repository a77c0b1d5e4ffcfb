"""The base of every pass's options: strict types and no unknown keys, importable without torch or onnx.

A recipe is validated before anything heavy loads (`mmtrt compile --plan` answers in a second), so a pass's
config lives in a module of its own that imports only pydantic, registered under the `mmtrt.pass_configs` entry
point group beside the pass itself.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict


class PassConfig(BaseModel):
    """Unknown keys are errors, so a typo never silently takes a default; and types are strict, so `true` is
    not read as 1, nor the text "16" as a number."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _exact_int(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def int_choice(*values: int):
    """A Literal of integers that refuses `true` and 1.0, which pydantic's Literal takes as 1 even when strict."""
    return Annotated[Literal[values], BeforeValidator(_exact_int)]
