"""Run the heavy commands that README.md and docs/quickstart.md show (those on zoo:dino-smollm, and `make demo`)
as a person would, on a terminal, and write what they printed to docs/results/quickstart-run.md. The docs test
checks the pages' excerpts against that record and runs the cheap commands itself.

    flock /work/wt/heavy.lock nice -n 10 .venv/bin/python scripts/record_quickstart.py      # 10-30 minutes

Run it from a checkout whose `make demo` environment exists (.venv) and that has no out/ folder yet, after
changing a recorded command or its output; it compiles zoo:dino-smollm into out/ (about 1 GB, several GB of memory
while lowering). Step times are recorded in a fresh cache folder, so compile shows what a first compile shows.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "tests")]
from doc_console import console_commands  # noqa: E402
from terminal import run_on_terminal  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "docs" / "quickstart.md", ROOT / "README.md")
RECORD = ROOT / "docs" / "results" / "quickstart-run.md"
NOT_RUN = ("make test",)  # the whole suite: CI runs it (.ci/run)
CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
CHECKOUT = "CHECKOUT"


def recorded(command: str) -> bool:
    """Commands too heavy for the test suite: the real model's, and the demo that compiles it."""
    return command not in NOT_RUN and ("dino-smollm" in command or command.startswith("make "))


def heavy_commands() -> list[str]:
    seen = []
    for page in PAGES:
        seen += [s.command for s in console_commands(page) if recorded(s.command) and s.command not in seen]
    return seen


def on_terminal(command: str, env: dict[str, str]) -> tuple[str, float]:
    """Run `command` in a shell on a pseudo-terminal; what stays visible, and the seconds it took."""
    start = time.perf_counter()
    code, shown = run_on_terminal(["bash", "-c", command], ROOT, env)
    if code:
        raise SystemExit(f"`{command}` exited with {code}:\n{shown}")
    return visible(shown), time.perf_counter() - start


def visible(text: str) -> str:
    """What a terminal shows at the end: each line as its last redraw, without cursor sequences; the checkout's
    folder (in a message naming the interpreter) written as CHECKOUT, so the record holds no machine's path."""
    lines = CSI.sub("", text).replace("\r\n", "\n").replace(str(ROOT), CHECKOUT).split("\n")
    return "\n".join(line.rsplit("\r", 1)[-1].rstrip() for line in lines).strip("\n") + "\n"


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    memory = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    return f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB, Linux {platform.release()}, Python {platform.python_version()}"


def main() -> None:
    if (ROOT / "out").exists():
        raise SystemExit("out/ exists: the quick start compiles into it as a new user would; move it away first")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "MMTRT_NO_PROGRESS")}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    env["MMTRT_CACHE"] = tempfile.mkdtemp(prefix="mmtrt-record-cache-")
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    runs = []
    for command in heavy_commands():
        print(f"$ {command}", flush=True)
        output, seconds = on_terminal(command, env)
        print(output, f"({seconds:.0f} s)", sep="", flush=True)
        runs.append((command, output, seconds))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# The quick start, as recorded", "",
             "Written by `scripts/record_quickstart.py`, which runs the commands of README.md and docs/quickstart.md "
             "that are too heavy for the test suite, on a terminal, as a person would; the docs test checks the "
             "pages' excerpts against this record (and runs the cheap commands itself). The checkout's folder is "
             "written as CHECKOUT.", "",
             f"- date: {date}", f"- commit: {commit}", f"- machine: {machine()}",
             "- the machine was shared with other jobs, so times are upper bounds", ""]
    for command, output, seconds in runs:
        lines += ["```console", f"$ {command}", output.rstrip("\n"), "```", f"took {seconds:.0f} s", ""]
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text("\n".join(lines))
    print(f"wrote {RECORD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
