"""`compile --device`: where export and calibration run. Here the CPU path: `cpu` and `auto` (no GPU visible)
write the same bundle, and `cuda` without a GPU is refused in one line with nothing written."""

import pytest
import torch
from conftest import ROOT

from mmtrt.bundle.trust import manifest_digest
from mmtrt.cli import main

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: this host has a GPU")
RECIPE = ROOT / "recipes" / "tiny-llava.yaml"


def test_cuda_without_a_gpu_is_refused_in_one_line(capsys, tmp_path):
    out = tmp_path / "b.bundle"
    assert main(["compile", str(RECIPE), "-o", str(out), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device cpu" in err and "Traceback" not in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.exports  # the device is where the export runs
def test_cpu_and_auto_write_the_same_bundle(tiny_bundle, tmp_path):
    out = tmp_path / "cpu.bundle"
    assert main(["compile", str(RECIPE), "-o", str(out), "--device", "cpu"]) == 0
    assert manifest_digest(out) == manifest_digest(tiny_bundle)
