"""The docs match the code: generated pages are current, the README's status matrix covers every command with
evidence that exists, every command the README and the quick start show runs as written with the output they
show, and every `make` target they name exists."""

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mmtrt.cli import build_parser
from mmtrt.docgen import ROOT, expected
from mmtrt.ir.families import FAMILIES
from mmtrt.pipeline.registry import registered_passes
from mmtrt.status import ROWS

spec = importlib.util.spec_from_file_location("record_quickstart", ROOT / "scripts" / "record_quickstart.py")
record_quickstart = importlib.util.module_from_spec(spec)
spec.loader.exec_module(record_quickstart)
from doc_console import console_commands, excerpt_problem  # noqa: E402  (scripts/, put on the path just above)

PAGES = record_quickstart.PAGES
RECORD = record_quickstart.RECORD
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_generated_docs_are_current():
    stale = [str(path.relative_to(ROOT)) for path, text in expected().items()
             if not path.exists() or path.read_text() != text]
    assert not stale, f"stale: {', '.join(stale)}; run: make docs"


def test_every_pass_has_a_page_that_says_what_it_does():
    for name in registered_passes():
        text = (ROOT / "docs" / "passes" / f"{name}.md").read_text()
        assert text.startswith(f"# `{name}`\n\n") and len(text.split("<!-- BEGIN")[0].split()) > 40, name


def test_readme_is_a_door_not_a_notebook():
    assert len((ROOT / "README.md").read_bytes()) <= 10_000
    for page in DOCS:
        text = page.read_text()
        for talk in ("this branch", "the issue", "issue ", "today's main", "/work/", "/tmp/"):
            assert talk not in text, f"{page.relative_to(ROOT)} says {talk!r}"


def test_nothing_points_into_readme_sections_that_moved_to_docs():
    sources = sorted((ROOT / "recipes").glob("*.yaml")) + sorted((ROOT / "scripts").glob("*.py")) + sorted(
        (ROOT / "mmtrt").rglob("*.py")) + sorted((ROOT / "passes").rglob("*.py"))
    stale = [str(path.relative_to(ROOT)) for path in sources if re.search(r'README(\.md)? "|README table', path.read_text())]
    assert not stale, f"these name a README section; point them at the docs/ page that holds it: {stale}"


def test_the_status_matrix_covers_every_command_with_evidence_that_exists():
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    named = " ".join(row.what for row in ROWS)
    missing = [c for c in commands if f"`mmtrt {c}`" not in named and f"`{c}`" not in named]
    assert not missing, f"commands missing from mmtrt/status.py: {missing}"
    for row in ROWS:
        for path in row.evidence:
            assert (ROOT / path).exists(), f"{row.what}: {path} does not exist"


def test_the_readme_lists_every_model_family_the_frontend_lowers():
    readme = (ROOT / "README.md").read_text()
    models = readme[readme.index("## Supported models"):readme.index("## Install")]
    missing = [model_type for model_type in FAMILIES if f"| `{model_type}` |" not in models]
    assert not missing, f"model_type {missing} lowered but not in the README's supported models"


def test_every_results_page_is_indexed_and_says_when_where_and_how_it_was_measured():
    results = ROOT / "docs" / "results"
    index = (results / "README.md").read_text()
    for page in sorted(results.glob("*.md")):
        if page.name == "README.md":
            continue
        text = page.read_text()
        assert f"]({page.name})" in index, f"docs/results/README.md does not link {page.name}"
        for what, pattern in (("date", r"20\d\d-\d\d-\d\d"), ("commit", r"\bcommit\b"),
                              ("machine", r"machine|\bcores?\b"), ("command", r"command|scripts/")):
            assert re.search(pattern, text, re.I), f"docs/results/{page.name} does not state its {what}"


def test_every_make_target_the_docs_name_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    sources = DOCS + sorted((ROOT / "recipes").glob("*.yaml")) + sorted((ROOT / "mmtrt").rglob("*.py"))
    for path in sources:
        for target in re.findall(r"[`(]make ([a-z][\w-]*)", path.read_text()):
            assert target in targets, f"{path.relative_to(ROOT)} names `make {target}`, which the Makefile lacks"


def recorded_outputs() -> dict[str, str]:
    return {shown.command: "\n".join(shown.excerpt) for shown in console_commands(RECORD)}


def run_as_written(command: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("shown", [s for page in PAGES for s in console_commands(page)],
                         ids=lambda s: f"{s.page}: {s.command[:60]}")
def test_every_command_shown_runs_as_written_with_the_output_shown(shown):
    """Commands on the real model (minutes each) are checked against scripts/record_quickstart.py's record of
    them; the others run here. `make test` is the suite itself: CI runs it."""
    if shown.command in record_quickstart.NOT_RUN:
        pytest.skip(f"`{shown.command}` is what CI runs")
    if record_quickstart.recorded(shown.command):
        outputs = recorded_outputs()
        assert shown.command in outputs, "not in docs/results/quickstart-run.md: run scripts/record_quickstart.py"
        output = outputs[shown.command]
    else:
        output = run_as_written(shown.command)
    problem = excerpt_problem(shown.excerpt, output)
    assert problem is None, f"{shown.page}: `{shown.command}`: {problem}"
