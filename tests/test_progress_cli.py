"""Progress is drawn for a person at a terminal (driven here under a pseudo-terminal) and never under --json or
into a pipe."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import ROOT
from terminal import run_on_terminal

MMTRT = [sys.executable, "-m", "mmtrt.cli"]


def child_env():
    return {k: v for k, v in os.environ.items() if k not in ("CI", "MMTRT_NO_PROGRESS")}


def run_in_pty(args, cwd, env=None) -> tuple[int, str]:
    return run_on_terminal(MMTRT + args, cwd, env or child_env())


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qa")
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (48, 48, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    (folder / "qa.jsonl").write_text("".join(json.dumps({"image": f"{i}.png", "prompt": "How many?", "answer": i}) + "\n"
                                             for i in range(2)))
    return folder / "qa.jsonl"


def test_eval_draws_progress_on_a_terminal_and_not_under_json(tiny_bundle, questions, tmp_path):
    args = ["eval", str(tiny_bundle), "--suite", "qa", "--data", str(questions)]
    code, shown = run_in_pty(args, tmp_path)
    assert code == 0, shown
    assert "qa questions:   0%" in shown and "0/2" in shown  # the bar is cleared when done
    code, shown = run_in_pty(args + ["--json"], tmp_path)
    assert code == 0, shown
    assert "qa questions" not in shown and "it/s" not in shown
    assert json.loads(shown.strip().splitlines()[-1])["samples"] == {"questions": 2}


def test_eval_in_a_pipe_draws_nothing(tiny_bundle, questions, tmp_path):
    proc = subprocess.run(MMTRT + ["eval", str(tiny_bundle), "--suite", "qa", "--data", str(questions)],
                          capture_output=True, text=True, cwd=tmp_path, env=child_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and proc.stdout.startswith("qa: accuracy_pct=")


def test_compile_shows_each_step_with_an_estimate_on_a_terminal_only(tmp_path):
    """In a pipe: nothing on stderr. On a terminal: every step, each component's lowering, every pass, the time
    each took (the run before, in a pipe, recorded them: they are this run's estimates) and what to run next."""
    recipe = str(ROOT / "recipes" / "tiny-llava.yaml")
    env = {**child_env(), "MMTRT_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(MMTRT + ["compile", recipe, "-o", str(tmp_path / "b.bundle")], capture_output=True,
                          text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines()[-1].startswith(f"next: mmtrt run {tmp_path / 'b.bundle'} --image "), proc.stdout
    code, shown = run_in_pty(["compile", recipe, "-o", str(tmp_path / "a.bundle")], tmp_path, env)
    assert code == 0, shown
    for line in ("mmtrt: reading the model's configs and tokenizer (about ", "mmtrt: loading the model (about ",
                 "mmtrt: lowering vision (4 layers) to ONNX (about ", "mmtrt: lowering embed to ONNX",
                 "mmtrt: lowering llm (4 layers) to ONNX (about ", "mmtrt: pass 1/2: dead_layer_elimination (about ",
                 "mmtrt: pass 2/2: graph_cleanup (about ", "mmtrt: writing the bundle (about ", " done in ",
                 f"wrote {tmp_path / 'a.bundle'}", "next: mmtrt run "):
        assert line in shown, shown
