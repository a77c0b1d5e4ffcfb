"""Which NVIDIA driver loads the plugins' PTX. A driver JIT-compiles PTX of its own CUDA release's ISA or older,
and nvcc writes the ISA of its release with no option for an older one: nvcc 13.0 writes `.version 9.0`, which
needs a driver for CUDA 13.0, the R580 branch, or newer (the cubins need no JIT). The table is NVIDIA's PTX ISA
and CUDA release notes (the first Linux driver branch of each release). Standard library only: the GPU check
imports it on a host without the project's environment."""

from __future__ import annotations

import ctypes
import re
import sys

# PTX ISA -> (the CUDA release whose nvcc writes it, that release's first driver branch)
PTX_DRIVERS = {"9.0": ("13.0", 580), "8.8": ("12.9", 575), "8.7": ("12.8", 570), "8.5": ("12.6", 560),
               "8.4": ("12.5", 555), "8.3": ("12.4", 550)}


def ptx_isa(ptx: str) -> str:
    return re.search(r"^\.version (\d+\.\d+)", ptx, re.M).group(1)


def needs(isa: str) -> str:
    """'R580 (CUDA 13.0) or newer' for ISA 9.0."""
    cuda, branch = PTX_DRIVERS[isa]
    return f"R{branch} (CUDA {cuda}) or newer"


def reason(isa: str, driver: str | None = None, driver_cuda: int | None = None) -> str | None:
    """None when a driver of this version ('580.159.03', from nvidia-smi) or CUDA version (13000, from
    cuDriverGetVersion) loads PTX of this ISA; otherwise why not and what to do."""
    if isa not in PTX_DRIVERS:
        return f"PTX ISA {isa} is not in mmtrt's table of ISAs and drivers (mmtrt/kernels/driver.py)"
    cuda, branch = PTX_DRIVERS[isa]
    major, minor = (int(x) for x in cuda.split("."))
    if driver is not None and int(driver.split(".")[0]) >= branch:
        return None
    if driver is None and driver_cuda is not None and driver_cuda >= major * 1000 + minor * 10:
        return None
    found = driver or (f"one for CUDA {driver_cuda // 1000}.{driver_cuda % 1000 // 10}" if driver_cuda else "none")
    return (f"the plugins' PTX (ISA {isa}, from CUDA {cuda}'s nvcc) needs an NVIDIA driver {needs(isa)}; this "
            f"host has {found}: update the driver")


def cuda_driver_version() -> int | None:
    """The CUDA version the installed driver supports (13000 for 13.0), from libcuda; None without a driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
    except OSError:
        return None
    version = ctypes.c_int(0)
    return version.value if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else None
