"""The `mmtrt` command line: one module per command, gathered here. Bad input is one line on stderr and exit code
2, never a traceback."""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

from mmtrt.cli import build_engines, compare, compile, eval, inspect, nightly, profile, run, sign, verify
from mmtrt.cli.arguments import DIGIT, Parser, examples, natural_int, positive_int
from mmtrt.cli.exit_codes import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USER_ERROR
from mmtrt.errors import Terminated, UserError
from mmtrt.progress import set_quiet
from mmtrt.serve.cli import add_commands as add_serve_commands
from mmtrt.terminal import one_line

COMMANDS_BEFORE_SERVE = (compile, run, eval, inspect, build_engines, compare, profile, nightly)
COMMANDS_AFTER_SERVE = (verify, sign)


def build_parser() -> Parser:
    parser = Parser(prog="mmtrt", description="Ahead-of-time compiler for LLaVA-style multimodal models: a recipe "
                    "in, a deployable bundle out, run by `mmtrt run`, Python or C++.",
                    epilog=examples("mmtrt compile recipes/dino-smollm.yaml -o out/dino-smollm.bundle",
                                    f"mmtrt run out/dino-smollm.bundle --image {DIGIT}",
                                    "mmtrt COMMAND --help            every option of a command, with examples")
                    + "\n\ndocs: docs/quickstart.md, docs/cli.md, docs/RECIPES.md")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS_BEFORE_SERVE:
        command.add_command(sub)
    add_serve_commands(sub, positive_int, natural_int, examples)
    for command in COMMANDS_AFTER_SERVE:
        command.add_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    set_quiet(bool(getattr(args, "json", False)))
    try:
        return args.func(args)
    except UserError as exc:
        print(f"mmtrt: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # `mmtrt inspect B | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # the file system's answer on a path the user gave: name too long, no permission, disk full
        print(f"mmtrt: error: {one_line(str(exc))}; check the path, its permissions and the free space", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print(f"mmtrt: interrupted by {'SIGTERM' if terminated else 'Ctrl-C'}; nothing half-written was left",
              file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


def run_as_module(argv: list[str] | None = None) -> NoReturn:
    """`python -m mmtrt.cli`: main's exit status, 130 also after a Ctrl-C that main handled.

    Under -m, CPython ends a process whose KeyboardInterrupt once escaped any C-level eval (a library's
    PyRun_String, as pybind11's py::exec is) by killing it with SIGINT at exit, however that exception was handled
    later: the flag it sets is global. So after a handled Ctrl-C the exit functions run here (temporary folders'
    finalizers among them) and the process exits with the status main gave."""
    code = main(argv)
    if code == EXIT_INTERRUPTED:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)

