"""docs/cli.md, generated from the parser so that it cannot drift: every command's `--help`, as printed."""

from __future__ import annotations

import argparse
import os

from mmtrt.cli import build_parser

WIDTH = 100
HEADER = """# Command line reference

Generated from the parser by `make docs` (`python -m mmtrt.docgen`); a test checks it is current. Every command
prints the same with `--help`. Bad input (a wrong option, a missing file, a recipe key that does not exist) is one
line on stderr naming the problem and the fix, and exit code 2.

| command | what it does |
| --- | --- |
"""


def _commands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in action._choices_actions}
    return {name: (helps[name], sub) for name, sub in action.choices.items()}


def render() -> str:
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)  # argparse wraps to the terminal's width; the page has its own
    try:
        parser = build_parser()
        commands = _commands(parser)
        lines = [HEADER.rstrip("\n")]
        lines += [f"| [`{name}`](#mmtrt-{name}) | {text} |" for name, (text, _) in commands.items()]
        lines += ["", "## mmtrt", "", "```", parser.format_help().rstrip(), "```"]
        for name, (_, sub) in commands.items():
            lines += ["", f"## mmtrt {name}", "", "```", sub.format_help().rstrip(), "```"]
    finally:
        if columns is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
