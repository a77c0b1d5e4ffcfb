"""Beside each ONNX partition the bundle carries a Polygraphy data loader, and `polygraphy run PART.onnx --onnxrt
--data-loader-script ...` (the line `mmtrt inspect` prints) runs, where Polygraphy's default inputs fail."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

from mmtrt.bundle.inspect import describe
from mmtrt.bundle.manifest import read_manifest

POLYGRAPHY = [sys.executable, "-c", "import sys; from polygraphy.tools import main; sys.exit(main())"]


def polygraphy(bundle, command):
    args = command.split()
    assert args[0] == "polygraphy"
    return subprocess.run(POLYGRAPHY + args[1:], cwd=bundle, capture_output=True, text=True, timeout=300)


def test_inspect_shows_the_commands(tiny_bundle):
    sections = read_manifest(tiny_bundle)["polygraphy"]
    assert set(sections) == {"vision", "embed", "llm"}
    text = describe(tiny_bundle)
    for section in sections.values():
        assert section["command"] in text and (tiny_bundle / section["data_loader"]).is_file()


def test_the_llm_loader_feeds_a_consistent_prefill_and_decode_step(tiny_bundle):
    m = read_manifest(tiny_bundle)
    spec = importlib.util.spec_from_file_location("loader", tiny_bundle / m["polygraphy"]["llm"]["data_loader"])
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    prefill, decode = list(loader.load_data())
    seq = prefill["inputs_embeds"].shape[1]
    assert seq == m["envelope"]["prompt_tokens"]["opt"] + m["model"]["vision"]["image_tokens"]
    assert prefill["past.0.key"].shape[2] == 0 and prefill["attention_mask"].shape == (1, seq)
    assert decode["inputs_embeds"].shape[1] == 1 and decode["past.0.key"].shape[2] == seq
    assert decode["attention_mask"].shape == (1, seq + 1) and decode["position_ids"].tolist() == [[seq]]
    again = list(loader.load_data())[0]["inputs_embeds"]
    np.testing.assert_array_equal(again, prefill["inputs_embeds"])  # a fixed seed: every run feeds the same


@pytest.mark.parametrize("component", ["llm", "vision", "embed"])
def test_polygraphy_runs_the_partition_with_the_loader(tiny_bundle, component):
    command = read_manifest(tiny_bundle)["polygraphy"][component]["command"]
    done = polygraphy(tiny_bundle, command)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "PASSED" in done.stdout + done.stderr


def test_polygraphys_default_inputs_fail_on_the_llm(tiny_bundle):
    """What a user met before: the mask must be past + seq long, and default shapes give every dim one size."""
    done = polygraphy(tiny_bundle, "polygraphy run llm.onnx --onnxrt")
    assert done.returncode != 0
