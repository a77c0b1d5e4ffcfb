"""Passes are found by name through the `mmtrt.passes` entry point group, so pass packages stay outside mmtrt."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from mmtrt.errors import UserError
from mmtrt.pipeline.pass_base import Pass

GROUP = "mmtrt.passes"


@cache
def registered_passes() -> dict[str, type[Pass]]:
    found = {}
    for ep in entry_points(group=GROUP):
        cls = ep.load()
        if cls.name != ep.name:
            raise RuntimeError(f"entry point {ep.name} loads pass {cls.name}; the names must agree")
        found[ep.name] = cls
    return dict(sorted(found.items()))


def get_pass(name: str) -> type[Pass]:
    passes = registered_passes()
    if name not in passes:
        raise UserError(f"unknown pass {name!r}; available passes: {', '.join(passes)}")
    return passes[name]
