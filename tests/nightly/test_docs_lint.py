"""docs/NIGHTLY.md is generated from the schema; the workflow and the Dockerfiles pass their linters (installed
from PyPI with the test extras; skipped, saying so, where they are missing). Neither image is built here."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from mmtrt.nightly.config import load_config
from mmtrt.nightly.docs import render

DOCKERFILES = sorted((ROOT / "docker").glob("*Dockerfile"))


def linter(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]' brings it)")
    return found


def test_nightly_reference_is_current():
    assert (ROOT / "docs" / "NIGHTLY.md").read_text() == render(), \
        "run: python -m mmtrt.nightly.docs > docs/NIGHTLY.md"


def test_example_config_is_valid():
    config, base, _ = load_config(ROOT / "scripts" / "nightly.yaml")
    for entry in config.recipes:
        assert (base / entry.recipe).is_file(), entry.recipe
    assert (base / config.benchmark.image).is_file()


def test_workflow_passes_actionlint():
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert workflows
    out = subprocess.run([linter("actionlint"), "-no-color", *map(str, workflows)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_workflow_runs_the_nightly_gpu_matrix_and_merge():
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    assert flow[True]["schedule"][0]["cron"]  # PyYAML reads the key `on` as True
    text = (ROOT / ".github" / "workflows" / "nightly.yml").read_text()
    for needed in ("mmtrt nightly", "--shard", "--merge", "build-engines", "scripts/gpu_check.sh", "self-hosted"):
        assert needed in text, needed


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_dockerfiles_pass_hadolint(dockerfile):
    out = subprocess.run([linter("hadolint"), "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
