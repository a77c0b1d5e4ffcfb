"""The console blocks of our markdown pages: ```console fences whose `$ ` lines are commands, each followed by an
excerpt of its output (`...` skips lines). The docs test and scripts/record_quickstart.py read them with this."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```console\n(.*?)^```", re.S | re.M)
SKIP = "..."


@dataclass(frozen=True)
class Shown:
    page: str
    command: str
    excerpt: tuple[str, ...]


def console_commands(page: Path) -> list[Shown]:
    """Every command of the page's console blocks, in order, with the output shown under it."""
    found = []
    for block in FENCE.findall(page.read_text()):
        command, excerpt = None, []
        for line in block.splitlines():
            if line.startswith("$ "):
                if command:
                    found.append(Shown(page.name, command, tuple(excerpt)))
                command, excerpt = line[2:], []
            elif command is not None:
                excerpt.append(line.rstrip())
        if command:
            found.append(Shown(page.name, command, tuple(excerpt)))
    return found


def excerpt_problem(excerpt: tuple[str, ...], output: str) -> str | None:
    """None when `excerpt` is `output` with runs of lines replaced by `...`; otherwise what differs."""
    lines = [line.rstrip() for line in output.rstrip("\n").splitlines()]
    chunks, chunk = [], []
    for line in excerpt:
        if line == SKIP:
            chunks.append(chunk)
            chunk = []
        else:
            chunk.append(line)
    chunks.append(chunk)
    at = 0
    for i, chunk in enumerate(chunks):
        anchored = i == 0
        start = _find(lines, chunk, at, anchored)
        if start is None:
            return f"not in the output{' at its start' if anchored else ''}: {chunk}"
        at = start + len(chunk)
    if chunks[-1] and at != len(lines):
        return f"the output goes on after {chunks[-1][-1]!r}: {lines[at:at + 3]}"
    return None


def _find(lines: list[str], chunk: list[str], at: int, anchored: bool) -> int | None:
    starts = [at] if anchored else range(at, len(lines) - len(chunk) + 1)
    for start in starts:
        if lines[start:start + len(chunk)] == chunk:
            return start
    return None
