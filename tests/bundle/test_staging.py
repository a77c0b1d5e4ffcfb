"""Compiles never destroy what is not a bundle, clean up on SIGTERM as on Ctrl-C, sweep what dead compiles left,
and --dump-ir leaves the IR the later passes see intact."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from builders import random_image
from conftest import ROOT
from mmtrt.bundle.staging import OWNER, claim, sweep_stale
from mmtrt.bundle.writer import staging_folder
from mmtrt.cli import main
from mmtrt.compiler import compile_recipe
from mmtrt.errors import Terminated, UserError
from mmtrt.runtime import load

TINY = ROOT / "recipes" / "tiny-llava.yaml"


def test_force_refuses_a_folder_that_is_not_a_bundle(tmp_path, capsys):
    project = tmp_path / "project"
    project.mkdir()
    (project / "thesis.tex").write_text("four years of work")
    assert main(["compile", str(TINY), "-o", str(project), "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(project) in err and "not an mmtrt bundle" in err, err
    assert (project / "thesis.tex").read_text() == "four years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


def test_force_refuses_a_file_and_a_bundle_holding_the_users_files(tiny_bundle, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="notes.txt is not an mmtrt bundle"):
        with staging_folder(tmp_path / "notes.txt", force=True):
            pass
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    (bundle / "tokenizer" / "mine.txt").write_text("mine")
    with pytest.raises(UserError, match=r"tokenizer/mine\.txt"):
        with staging_folder(bundle, force=True):
            pass
    assert (bundle / "tokenizer" / "mine.txt").read_text() == "mine"


def test_force_replaces_a_bundle_and_its_engines(tiny_bundle, tmp_path):
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    (bundle / "engines").mkdir()
    (bundle / "engines" / "index.json").write_text("{}")
    with staging_folder(bundle, force=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in bundle.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def staged(parent, name, owner):
    folder = parent / name
    folder.mkdir()
    if owner is not None:
        (folder / OWNER).write_text(json.dumps(owner))
    return folder


def test_sweep_removes_only_folders_of_provably_dead_compiles(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    claim(live)
    me = json.loads((live / OWNER).read_text())
    dead = staged(tmp_path, ".out.tmp-dead", {**me, "pid": dead_pid()})
    reused = staged(tmp_path, ".out.old-reused", {**me, "started": "1"})
    rebooted = staged(tmp_path, ".x.tmp-boot", {**me, "boot": "another-boot"})
    running = staged(tmp_path, ".out.tmp-live", me)
    other_host = staged(tmp_path, ".out.tmp-host", {**me, "host": socket.gethostname() + "-other", "pid": dead_pid()})
    unowned = staged(tmp_path, ".out.tmp-unowned", None)
    garbage = staged(tmp_path, ".out.tmp-garbage", None)
    (garbage / OWNER).write_text("{not json")
    user = staged(tmp_path, "results.tmp-1", {**me, "pid": dead_pid()})
    assert sorted(sweep_stale(tmp_path)) == sorted([dead, reused, rebooted])
    assert all(p.exists() for p in (running, other_host, unowned, garbage, user, live))


def test_a_compile_sweeps_what_a_killed_compile_left(tmp_path, monkeypatch):
    left = staged(tmp_path, ".out.tmp-abcd", None)
    claim(left)
    owner = json.loads((left / OWNER).read_text())
    (left / OWNER).write_text(json.dumps({**owner, "pid": dead_pid()}))
    with staging_folder(tmp_path / "out", force=False) as tmp:
        assert not left.exists()
        assert (tmp / OWNER).is_file()
        (tmp / "a").write_text("a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a"]


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_a_signal_during_compile_cleans_up_with_one_line(tmp_path, sig, code, word):
    # a runner that started the tests in the background may ignore SIGINT; Python keeps that unless reset
    proc = subprocess.Popen([sys.executable, "-m", "mmtrt.cli", "compile", str(TINY), "-o", str(tmp_path / "out")],
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(f".out.tmp-*/{OWNER}")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the compile ended before it could be interrupted"
    proc.send_signal(sig)
    err = proc.communicate(timeout=60)[1].strip()
    assert proc.returncode == code, err
    assert len(err.splitlines()) == 1 and word in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


INTERRUPTED_IN_C_EVAL = """
import argparse, ctypes
from mmtrt import cli

def interrupted(args):  # a KeyboardInterrupt escapes a C-level eval, as one can from a library's PyRun_String
    run = ctypes.pythonapi.PyRun_String
    run.restype, run.argtypes = ctypes.py_object, [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
    run(b"raise KeyboardInterrupt", 257, {}, {})

def parser():
    p = argparse.ArgumentParser()
    p.set_defaults(func=interrupted)
    return p

cli.build_parser = parser
cli.run_as_module([])
"""


def test_python_m_exits_130_after_a_ctrl_c_that_escaped_a_c_level_eval(tmp_path):
    """The intermittent rc -2 of the test above: under -m, CPython kills the process with SIGINT at exit when a
    KeyboardInterrupt once escaped run_eval_code_obj, although main handled it; here made to happen every time."""
    (tmp_path / "interrupted_in_c_eval.py").write_text(INTERRUPTED_IN_C_EVAL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "interrupted_in_c_eval"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines() == ["mmtrt: interrupted by Ctrl-C; nothing half-written was left"]


class SignalsInFinalizer:
    """Sends SIGTERM from __del__: the handler's exception is raised inside the finalizer, where Python ignores it."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(1000))  # bytecode after the kill: the handler runs here


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_sigterm_whose_exception_a_finalizer_swallowed_still_stops_the_swap(tmp_path):
    with pytest.raises(Terminated):
        with staging_folder(tmp_path / "out", force=False) as tmp:
            (tmp / "a").write_text("a")
            SignalsInFinalizer()
            (tmp / "b").write_text("the block went on: the exception was swallowed")
    assert list(tmp_path.iterdir()) == []


def test_dump_ir_keeps_the_live_ir_for_later_passes(tiny_bundle, tmp_path, rng):
    dumps = tmp_path / "dumps"
    bundle = compile_recipe(TINY, tmp_path / "dumped", dump_dir=dumps)
    assert sorted(p.name for p in dumps.iterdir()) == ["01_dead_layer_elimination", "02_graph_cleanup"]
    assert (dumps / "01_dead_layer_elimination" / "llm.onnx.data").stat().st_size > 0
    image = random_image(rng, 50, 60)
    dumped, plain = load(bundle), load(tiny_bundle)
    assert dumped.manifest["artifacts"] == plain.manifest["artifacts"]
    a, b = dumped.generate(image, "What is it?", 6), plain.generate(image, "What is it?", 6)
    assert a.token_ids == b.token_ids
    pixels = dumped.pixel_values(image)
    np.testing.assert_array_equal(dumped.image_features(pixels), plain.image_features(pixels))


@pytest.mark.parametrize("force", [False, True])
def test_a_folder_made_during_the_compile_is_left_alone(tmp_path, force):
    """The check before the build is not enough: the swap checks again and renames without replacing."""
    out = tmp_path / "out.bundle"
    with pytest.raises(UserError, match="appeared during the compile" if not force else "not an mmtrt bundle"):
        with staging_folder(out, force=force) as tmp:
            (tmp / "manifest.json").write_text("{}")
            out.mkdir()
            (out / "notes.txt").write_text("mine")
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bundle"]


def test_an_empty_folder_made_during_the_compile_is_not_replaced(tmp_path):
    out = tmp_path / "out.bundle"
    with pytest.raises(UserError, match="appeared during the compile"):
        with staging_folder(out, force=False) as tmp:
            (tmp / "new.txt").write_text("new")
            out.mkdir()
    assert list(out.iterdir()) == []


def test_two_compiles_to_one_output_keep_the_first_bundle(tiny_bundle, tmp_path):
    out = tmp_path / "out.bundle"
    with pytest.raises(UserError, match="appeared during the compile"):
        with staging_folder(out, force=False) as first:
            (first / "first.txt").write_text("first")
            with staging_folder(out, force=False) as second:
                shutil.copytree(tiny_bundle, second, dirs_exist_ok=True)
    assert (out / "manifest.json").is_file() and not (out / "first.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bundle"]
