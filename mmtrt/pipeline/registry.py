"""Passes are found by name through entry point groups, so pass packages stay outside mmtrt: `mmtrt.passes`
names each pass, and `mmtrt.pass_configs` its options, which load without torch or onnx."""

from __future__ import annotations

import difflib
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from mmtrt.errors import UserError

if TYPE_CHECKING:
    from mmtrt.pipeline.pass_base import Pass
    from mmtrt.pipeline.pass_config import PassConfig

GROUP = "mmtrt.passes"
CONFIG_GROUP = "mmtrt.pass_configs"


@cache
def registered_passes() -> dict[str, type[Pass]]:
    found = {}
    for ep in entry_points(group=GROUP):
        cls = ep.load()
        if cls.name != ep.name:
            raise RuntimeError(f"entry point {ep.name} loads pass {cls.name}; the names must agree")
        found[ep.name] = cls
    return dict(sorted(found.items()))


@cache
def registered_configs() -> dict[str, type[PassConfig]]:
    """Each pass's config class, loaded without the pass's own module (and its heavy imports)."""
    return dict(sorted((ep.name, ep.load()) for ep in entry_points(group=CONFIG_GROUP)))


def unknown_pass(name: str, known) -> str:
    """What to say about a pass name that is not registered: the closest name, and every name."""
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown pass {name!r}; {hint}available passes: {', '.join(known)}"


def get_pass(name: str) -> type[Pass]:
    passes = registered_passes()
    if name not in passes:
        raise UserError(unknown_pass(name, passes))
    return passes[name]
