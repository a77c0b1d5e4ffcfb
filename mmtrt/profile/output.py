"""The report folder of `mmtrt profile`: new, empty, or a report it wrote before; never a folder of the user's.

A re-run into its own earlier report replaces it; a folder holding anything else (an `index.html` or a
`report.json` of the user's) is refused before the work starts and checked again before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

from mmtrt.errors import UserError

MARK = "mmtrt_profile"  # report.json's key naming the files the report wrote


def check_output(out: Path) -> None:
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise UserError(f"{out} exists and is not a folder; pass another -o")
    foreign = sorted({p.name for p in out.iterdir()} - set(_written_before(out)))
    if foreign:
        raise UserError(f"{out} holds files `mmtrt profile` did not write ({', '.join(foreign[:3])}); pass a new or "
                        "empty folder as -o")


def _written_before(out: Path) -> list[str]:
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return []
    files = report.get(MARK) if isinstance(report, dict) else None
    return [f for f in files if isinstance(f, str) and "/" not in f] if isinstance(files, list) else []


def mark(report: dict, files: list[str]) -> None:
    """Record in the report the files it wrote (report.json and index.html included)."""
    report[MARK] = sorted({*files, "report.json", "index.html"})
