"""How the command line is parsed: argument errors in one line with the closest valid spelling, value types checked
before any work, examples kept as written."""

from __future__ import annotations

import argparse
import difflib
import math
import re
from pathlib import Path

from mmtrt.cli.exit_codes import EXIT_USER_ERROR
from mmtrt.terminal import one_line


class HelpFormatter(argparse.HelpFormatter):
    """Examples kept as written, and every option's default shown unless its help already says it."""

    def _fill_text(self, text, width, indent):
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or action.option_strings == []:
            return text
        return f"{text} (default: {action.default})"


class Parser(argparse.ArgumentParser):
    """Argument errors as one line, like every other bad input (argparse prints the usage too), with the closest
    command, choice or option when the user mistyped one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, formatter_class=HelpFormatter, **kwargs)

    def error(self, message):
        self.exit(EXIT_USER_ERROR, f"mmtrt: error: {self.prog}: {one_line(self._explained(message))}; "
                                   f"see `{self.prog} --help`\n")

    def _explained(self, message: str) -> str:
        choice = re.match(r"argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if choice:
            name, given, allowed = choice[1], choice[2], re.findall(r"'([^']*)'", choice[3])
            what = "command" if name == "COMMAND" else f"value for {name}"
            close = difflib.get_close_matches(given, allowed, n=1)
            hint = f"; did you mean {_shown_choice(self.prog, name, close[0])}?" if close else ""
            return f"unknown {what} '{given}'{hint} (one of {', '.join(allowed)})"
        if message == "the following arguments are required: COMMAND":
            return f"no command given; one of {', '.join(self._commands())}"
        unknown = re.match(r"unrecognized arguments: (--?\S+)", message)
        if unknown:
            close = difflib.get_close_matches(unknown[1], self._option_strings(), n=1)
            return f"{message}; did you mean {close[0]}?" if close else message
        return message

    def _commands(self) -> list[str]:
        return [name for a in self._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices]

    def _option_strings(self) -> list[str]:
        """Every option of this parser and of its commands."""
        parsers = [self] + [sub for a in self._actions if isinstance(a, argparse._SubParsersAction)
                            for sub in a.choices.values()]
        return [s for parser in parsers for a in parser._actions for s in a.option_strings]


def _shown_choice(prog: str, argument: str, choice: str) -> str:
    return f"`{prog} {choice}`" if argument == "COMMAND" else f"'{choice}'"


def _parse(text: str, kind: type, what: str, ok) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_int(text: str) -> int:
    return _parse(text, int, "an integer >= 1", lambda v: v >= 1)


def natural_int(text: str) -> int:
    return _parse(text, int, "an integer >= 0", lambda v: v >= 0)


def tolerance(text: str) -> float:
    return _parse(text, float, "a finite number >= 0", lambda v: math.isfinite(v) and v >= 0)


def output_file(text: str) -> Path:
    """A file the command writes at the end: its folder must exist now, not after minutes of work."""
    path = Path(text)
    if path.is_dir() or not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder or its folder does not exist")
    return path


def examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


DIGIT = 'examples/digit-5.png --prompt "Which digit is shown?"'
