"""Protobuf messages copied field by field, so that a large repeated field can be left behind."""

from __future__ import annotations


def copy_fields(src, dst, skip: str) -> None:
    """Every field of message `src` set on `dst` except `skip`."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)
