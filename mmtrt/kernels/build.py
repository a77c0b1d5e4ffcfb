"""Build the plugin kernels: the CPU twins into a shared library, the CUDA kernels into cubins and PTX.

One Python builder rather than CMake, because the compiler needs the device code too (a bundle carries the PTX
and cubins of the plugins it uses) and the tests need the CPU twin; both call this module, and `make kernels`
does as well. Outputs go to build/kernels/<digest>/, where the digest covers the sources, the flags and the
compiler's version, so a build is reused until one of them changes, and the same inputs give the same bytes.
`python -m mmtrt.kernels.build` builds everything and prints the ptxas report.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from mmtrt.errors import UserError

SOURCE_DIR = Path(__file__).resolve().parent / "csrc"
BUILD_ROOT = Path(os.environ.get("MMTRT_KERNEL_BUILD", Path(__file__).resolve().parents[2] / "build" / "kernels"))
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
PTX_ARCH = "compute_80"  # the lowest target: the driver JIT-compiles it for any later GPU
NVCC_FLAGS = ("-std=c++17", "-O3", "-fmad=false")  # no contraction: the CPU twin rounds the same way
CXX_FLAGS = ("-std=c++17", "-O2", "-ffp-contract=off", "-shared", "-fPIC")
TWIN = "libmmtrt_kernels_cpu.so"
DEVICE_SOURCE = "kernels.cu"
TWIN_SOURCE = "cpu_twin.cpp"


def nvcc() -> str | None:
    return shutil.which("nvcc") or (str(Path("/usr/local/cuda/bin/nvcc")) if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@lru_cache(maxsize=None)
def tool_version(tool: str) -> str:
    return subprocess.run([tool, "--version"], capture_output=True, text=True, check=True).stdout.strip()


def sources() -> list[Path]:
    return sorted(p for p in SOURCE_DIR.iterdir() if p.suffix in (".h", ".cu", ".cpp"))


def source_digest() -> str:
    h = hashlib.sha256()
    for p in sources():
        h.update(f"{p.name}:{hashlib.sha256(p.read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest()


def _folder(kind: str, tool: str, flags: tuple[str, ...]) -> Path:
    h = hashlib.sha256(f"{kind}\n{source_digest()}\n{tool_version(tool)}\n{' '.join(flags)}".encode())
    return BUILD_ROOT / f"{kind}-{h.hexdigest()[:16]}"


def _run(cmd: list[str], cwd: Path) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return done.stderr


def _publish(tmp: Path, folder: Path) -> Path:
    """Rename a finished build into place (another process may have won the race: keep theirs)."""
    try:
        os.rename(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def cpu_twin() -> Path:
    """The CPU twin library, built on first use; MMTRT_KERNEL_TWIN names a prebuilt one instead (the GPU check
    carries one to a host that may lack g++)."""
    if os.environ.get("MMTRT_KERNEL_TWIN"):
        return Path(os.environ["MMTRT_KERNEL_TWIN"])
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise UserError("building the CPU twin of the plugin kernels needs a C++ compiler; install g++")
    folder = _folder("cpu", cxx, CXX_FLAGS)
    if not (folder / TWIN).is_file():
        BUILD_ROOT.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=BUILD_ROOT, prefix=".cpu-"))
        _run([cxx, *CXX_FLAGS, TWIN_SOURCE, "-o", str(tmp / TWIN)], SOURCE_DIR)
        _publish(tmp, folder)
    return folder / TWIN


@dataclass(frozen=True)
class DeviceBuild:
    folder: Path
    ptx: Path
    cubins: dict[str, Path]
    log: Path

    def files(self) -> list[Path]:
        return [self.ptx, *self.cubins.values()]


def device_code() -> DeviceBuild:
    """PTX for compute_80 and a cubin per architecture in ARCHS, with the ptxas -v report in ptxas.log."""
    tool = nvcc()
    if tool is None:
        raise UserError("the plugin kernels need nvcc (CUDA 12 or later) to build; install the CUDA toolkit or "
                        "remove fuse_plugins from the recipe")
    folder = _folder("cuda", tool, NVCC_FLAGS)
    build = DeviceBuild(folder, folder / "kernels.ptx", {a: folder / f"kernels.{a}.cubin" for a in ARCHS},
                        folder / "ptxas.log")
    if build.log.is_file():
        return build
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=BUILD_ROOT, prefix=".cuda-"))
    jobs = [nvcc_command(PTX_ARCH, tmp / build.ptx.name)]
    jobs += [nvcc_command(a, tmp / build.cubins[a].name) for a in ARCHS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        logs = list(pool.map(lambda cmd: _run(cmd, SOURCE_DIR), jobs))
    (tmp / build.log.name).write_text("".join(f"# {a}\n{log}" for a, log in zip(ARCHS, logs[1:])))
    _publish(tmp, folder)
    return build


def nvcc_command(arch: str, out: Path) -> list[str]:
    """PTX for a virtual architecture (compute_*), a cubin with the ptxas report for a real one (sm_*); run in
    SOURCE_DIR so no absolute path enters the output."""
    if arch.startswith("compute_"):
        return [nvcc(), *NVCC_FLAGS, "-ptx", f"-arch={arch}", DEVICE_SOURCE, "-o", str(out)]
    return [nvcc(), *NVCC_FLAGS, "-cubin", f"-arch={arch}", "-Xptxas", "-v", DEVICE_SOURCE, "-o", str(out)]


ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USAGE = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def ptxas_report(log: str) -> dict[str, dict[str, dict[str, int]]]:
    """Per architecture and kernel: registers, spill stores and loads (bytes), stack and static shared memory."""
    report: dict[str, dict[str, dict[str, int]]] = {}
    entry = None
    for line in log.splitlines():
        if m := ENTRY.search(line):
            entry = report.setdefault(m.group(2), {}).setdefault(m.group(1), {})
        elif entry is not None and (m := SPILLS.search(line)):
            entry.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif entry is not None and (m := USAGE.search(line)):
            entry.update(registers=int(m.group(1)), smem=int(m.group(2) or 0))
    return report


def main() -> int:
    try:
        return _report()
    except UserError as exc:
        print(f"mmtrt kernels: error: {exc}", file=sys.stderr)
        return 2


def _report() -> int:
    print(f"CPU twin: {cpu_twin()}")
    if nvcc() is None:
        print("nvcc not found: device code not built")
        return 0
    build = device_code()
    print(f"device code: {build.folder}")
    for arch, kernels in ptxas_report(build.log.read_text()).items():
        for name, r in sorted(kernels.items()):
            print(f"  {arch} {name:<26} {r['registers']:>3} registers, {r['spill_stores']} B spill stores, "
                  f"{r['spill_loads']} B spill loads, {r['smem']} B static smem")
    return 0


if __name__ == "__main__":
    sys.exit(main())
