"""nvcc builds every kernel for sm_80, sm_86, sm_89 and sm_90 (cubin) and PTX; ptxas reports no spills; the
device code is byte-stable, so a bundle that carries it stays deterministic."""

import re
import subprocess

import pytest

from mmtrt.kernels import build

pytestmark = pytest.mark.skipif(build.nvcc() is None, reason="nvcc is not installed: the CUDA kernels cannot be compiled here")
ENTRIES = {f"mmtrt_token_select{m}_{t}" for m in ("", "_merge", "_scored", "_dynamic") for t in ("f32", "f16", "bf16")} | {
    f"mmtrt_int4_gemm_{t}" for t in ("f32_f32", "f16_f16", "f16_f32", "bf16_bf16", "bf16_f32")}


@pytest.fixture(scope="session")
def device():
    return build.device_code()


def test_every_kernel_builds_for_every_architecture(device):
    report = build.ptxas_report(device.log.read_text())
    assert set(report) == set(build.ARCHS)
    for arch, kernels in report.items():
        assert set(kernels) == ENTRIES, arch
        assert all(device.cubins[arch].read_bytes()[:4] == b"\x7fELF" for arch in build.ARCHS)
    ptx = device.ptx.read_text()
    assert {m for m in re.findall(r"\.visible \.entry (\w+)\(", ptx)} == ENTRIES
    assert ".target sm_80" in ptx


def test_no_kernel_spills_registers(device):
    for arch, kernels in build.ptxas_report(device.log.read_text()).items():
        for name, r in kernels.items():
            assert r["spill_stores"] == 0 and r["spill_loads"] == 0, f"{name} spills on {arch}: {r}"
            assert r["registers"] <= 128, f"{name} uses {r['registers']} registers on {arch}"


def test_ptxas_report_parses_spills():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\nptxas info    : Function properties for k\n"
           "    8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem\n")
    assert build.ptxas_report(log) == {"sm_90": {"k": {"stack": 8, "spill_stores": 12, "spill_loads": 16,
                                                       "registers": 255, "smem": 1024}}}


def test_device_code_is_byte_stable(device, tmp_path):
    """A second compile of the same sources with the same flags gives the same bytes (sm_80 and the PTX)."""
    for arch, built in (("sm_80", device.cubins["sm_80"]), (build.PTX_ARCH, device.ptx)):
        out = tmp_path / built.name
        subprocess.run(build.nvcc_command(arch, out), cwd=build.SOURCE_DIR, check=True, capture_output=True)
        assert out.read_bytes() == built.read_bytes(), built.name
