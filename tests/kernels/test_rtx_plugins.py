"""mmtrt's plugins built into engines by TensorRT-RTX's real ONNX parser and builder on the CPU (mmtrt/kernels/rtx.py):
each plugin node as fuse_plugins writes it, and a linear fuse_plugins fused, parse as a PLUGIN_V3 layer with the
output shapes the plugin gives and build into an engine that records the plugin; a type combination the kernels
lack finds no format and builds nothing. The builds run in a process of their own (tests/rtx_plugin_builds.py):
registering plugin creators is process-wide."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorrt_rtx")
SCRIPT = Path(__file__).resolve().parents[1] / "rtx_plugin_builds.py"
SHAPES = {"TokenSelect": [[-1, 8, 32]], "TokenSelectMerge": [[-1, 8, 32]], "TokenSelectScored": [[-1, 8, 32]],
          "TokenSelectDynamic": [[-1, 8, 32], [-1]], "Int4GroupGemm": [[-1, 64]]}


@pytest.fixture(scope="module")
def builds():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # TensorRT's own log lines come first


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_plugin_node_builds_into_an_rtx_engine(builds, name):
    record = builds[name]
    assert record["parsed"] and not record["errors"]
    assert record["layers"].count("PLUGIN_V3") == 1  # imported as the plugin, not as its local function
    assert record["outputs"] == SHAPES[name]
    assert record["engine_bytes"] > 0 and {name, "mmtrt"} <= set(record["names_in_engine"])


def test_a_linear_fuse_plugins_fused_builds(builds):
    record = builds["fused linear"]
    assert record["parsed"] and record["layers"].count("PLUGIN_V3") == 1 and record["outputs"] == [[-1, 64]]
    assert record["engine_bytes"] > 0 and "Int4GroupGemm" in record["names_in_engine"]


def test_types_no_kernel_takes_build_nothing(builds):
    """fp16 activations with bf16 scales: kernels.cu has no such instance, the plugin offers no such format."""
    record = builds["Int4GroupGemm bf16 scales"]
    assert record["parsed"] and record["engine_bytes"] == 0
