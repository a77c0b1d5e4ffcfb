"""A bundle compiled with fuse_plugins: it carries the plugin files with their digests, the engine plan lists the
plugins per segment (`build-engines --plan` shows them), tampering is caught, and the bundle still runs on the CPU."""

import importlib.util
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from builders import random_image
from conftest import compile_to
from mmtrt import cli
from mmtrt.bundle.inspect import describe, describe_placement
from mmtrt.bundle.manifest import read_manifest, sha256_file
from mmtrt.errors import UserError
from mmtrt.kernels import build
from mmtrt.kernels.bundle import check_plugins, write_plugins
from mmtrt.runtime import load

pytestmark = pytest.mark.skipif(build.nvcc() is None, reason="nvcc is not installed: a bundle cannot carry plugin kernels")
RECIPE = """model: {source: zoo, name: tiny-llava}
passes:
  - dead_layer_elimination: {}
  - token_prune: {keep: 0.5}
  - awq_int4: {method: rtn, group_size: 64, calibration: {samples: 1, text_windows: 1, search_tokens: 64}}
  - cast_precision: {dtype: fp16}
  - fuse_plugins: {plugins: [token_select, int4_gemm]}
envelope: {batch: {min: 1, opt: 1, max: 2}, prompt_tokens: {min: 1, opt: 16, max: 64}, max_new_tokens: 4}
"""
PLUGINS = ["mmtrt::Int4GroupGemm", "mmtrt::TokenSelect"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return compile_to(tmp_path_factory.mktemp("plugins"), RECIPE)


def test_manifest_carries_every_plugin_file_with_its_digest(bundle):
    plugins = read_manifest(bundle)["tensorrt"]["plugins"]
    assert sorted(plugins) == PLUGINS
    for entry in plugins.values():
        assert entry["namespace"] == "mmtrt" and entry["version"] == "1"
        assert entry["architectures"] == ["sm_80", "sm_86", "sm_89", "sm_90"] and entry["ptx_target"] == "compute_80"
        files = {entry["ptx"], entry["registration"], "plugins/launch.py", *entry["cubins"].values()}
        assert set(entry["sha256"]) == files
        ptx_version = (bundle / entry["ptx"]).read_text().split(".version ", 1)[1].split()[0]
        assert entry["ptx_isa"] == ptx_version and "CUDA" in entry["ptx_driver"]
        assert all(sha256_file(bundle / name) == digest for name, digest in entry["sha256"].items())


def test_plan_lists_plugins_per_segment(bundle, capsys):
    assert cli.main(["build-engines", str(bundle), "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert sorted(plan["plugins"]) == PLUGINS
    by_segment = {s["id"]: s["aot_plugins"] for s in plan["segments"]}
    assert by_segment == {"vision.0": ["mmtrt::TokenSelect"], "llm.0": ["mmtrt::Int4GroupGemm"]}
    manifest = read_manifest(bundle)["tensorrt"]["segments"]
    assert all("trtexec cannot load" in s["trtexec_note"] for s in manifest)
    assert all("trtexec" not in s for s in plan["segments"])


def test_build_engines_builds_the_plugin_segments_with_tensorrt_rtx(bundle, tmp_path):
    """build-engines --target rtx registers the plugins (mmtrt.kernels.rtx) and builds every segment: the one build
    path takes plugin segments too. In a process of its own: plugin creators are registered process-wide."""
    pytest.importorskip("tensorrt_rtx")
    copy = shutil.copytree(bundle, tmp_path / "b")
    done = subprocess.run([sys.executable, "-m", "mmtrt.cli", "build-engines", str(copy), "--target", "rtx", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    records = {r["segment"]: r for r in json.loads(done.stdout[done.stdout.index("["):])}
    assert records["vision.0"]["status"] == records["llm.0"]["status"] == "built"
    assert all((copy / r["file"]).stat().st_size == r["engine_bytes"] for r in records.values())


def test_inspect_shows_plugin_nodes_and_plugins(bundle):
    text = describe_placement(bundle)
    assert "plugin mmtrt::TokenSelect: 1 node(s)" in text and "plugin mmtrt::Int4GroupGemm:" in text
    assert "mmtrt::Int4GroupGemm v1 kernel mmtrt_int4_gemm_*" in describe(bundle)


def test_a_modified_plugin_file_is_refused(bundle, tmp_path):
    copy = shutil.copytree(bundle, tmp_path / "copy")
    with open(copy / "plugins" / "kernels.ptx", "ab") as f:
        f.write(b"// edited\n")
    with pytest.raises(UserError, match="plugins/kernels.ptx is missing or modified"):
        check_plugins(copy, read_manifest(copy)["tensorrt"]["plugins"])
    check_plugins(bundle, read_manifest(bundle)["tensorrt"]["plugins"])


def test_plugin_files_are_rebuilt_byte_for_byte(bundle, tmp_path):
    """What a second compile writes: the same files, the same digests."""
    again = write_plugins(tmp_path, PLUGINS)
    recorded = read_manifest(bundle)["tensorrt"]["plugins"]
    assert {k: v["sha256"] for k, v in again.items()} == {k: v["sha256"] for k, v in recorded.items()}


def test_bundle_with_plugin_nodes_runs_on_the_cpu(bundle):
    result = load(bundle, threads=1).generate(random_image(np.random.default_rng(), 40, 56), "What is it?", max_new_tokens=3)
    assert len(result.token_ids) == 3
    # no TensorRT here: the plugin nodes ran as their functions (the recipe does not opt in to TensorRT-LLM)
    assert set(result.fallbacks) == {"vision.0", "llm.0"}


def test_loading_rtx_plugins_builds_no_parser_library(bundle, tmp_path, monkeypatch):
    """Only a build parses ONNX: a load registers the creators without g++ and writes nothing (a read-only
    install), where the parser's link library would need both."""
    trt = pytest.importorskip("tensorrt_rtx")
    from mmtrt.kernels import rtx
    from mmtrt.kernels.bundle import register_plugins

    monkeypatch.setattr(build, "BUILD_ROOT", tmp_path / "kernels")
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++ on it
    rtx._stub.cache_clear()
    register_plugins(bundle, read_manifest(bundle)["tensorrt"]["plugins"], trt, parsing=False)
    assert not (tmp_path / "kernels").exists()
    with pytest.raises(UserError, match="install g\\+\\+"):
        rtx.provide_parser_library(trt)
    rtx._stub.cache_clear()


def test_an_rtx_engine_with_plugins_falls_back_to_onnx_runtime_with_the_reason(bundle):
    """Where CuPy is missing, a TensorRT-RTX engine that would match is given up for ONNX Runtime, saying why."""
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    from mmtrt.runtime.executors import _plugins_runnable

    manifest = read_manifest(bundle)
    entries = manifest["tensorrt"]["segments"]
    matched = {e["id"]: (bundle / "engines" / f"{e['id']}-rtx.engine", "matches this host") for e in entries}
    choices = _plugins_runnable(bundle, manifest, entries, matched)
    users = {e["id"] for e in entries if e.get("aot_plugins")}
    assert users and all(choices[s][0] is None and "CuPy, which is not installed" in choices[s][1] for s in users)
    assert "not loaded: its plugins (mmtrt::" in choices[min(users)][1]
    assert {s: c for s, c in choices.items() if s not in users} == {s: c for s, c in matched.items() if s not in users}
