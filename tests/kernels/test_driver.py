"""The driver the plugins' PTX needs: nvcc 13's ISA 9.0 loads on R580 drivers (CUDA 13.0) and newer, by the
driver's version from nvidia-smi or the CUDA version from cuDriverGetVersion, and the bundle records it."""

import pytest

from mmtrt.kernels import build, driver


def test_isa_9_needs_an_r580_driver():
    assert driver.reason("9.0", "580.159.03") is None and driver.reason("9.0", "590.1") is None
    assert driver.reason("9.0", driver_cuda=13000) is None and driver.reason("9.0", driver_cuda=13010) is None
    why = driver.reason("9.0", "575.57.08")
    assert "R580 (CUDA 13.0) or newer" in why and "575.57.08" in why and "update the driver" in why
    assert "one for CUDA 12.8" in driver.reason("9.0", driver_cuda=12080)
    assert "has none" in driver.reason("9.0")
    assert "not in mmtrt's table" in driver.reason("9.9", "600.1")


def test_the_bundle_records_the_driver_its_ptx_needs(tmp_path):
    from mmtrt.kernels.bundle import write_plugins

    if build.nvcc() is None:
        pytest.skip("the plugin files need nvcc")
    entry = write_plugins(tmp_path, ["mmtrt::TokenSelect"])["mmtrt::TokenSelect"]
    isa = driver.ptx_isa((tmp_path / entry["ptx"]).read_text())
    assert entry["ptx_isa"] == isa and driver.needs(isa) in entry["ptx_driver"]
    if build.tool_version(build.nvcc()).count("cuda_13.0"):
        assert isa == "9.0" and "R580" in entry["ptx_driver"]
