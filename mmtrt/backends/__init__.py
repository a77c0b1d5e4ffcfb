"""Backends. Each heavy framework is imported lazily, so mmtrt imports and runs on hosts that lack it."""

from __future__ import annotations

import ctypes
import importlib
import sys


def _import_error(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # a broken install fails with more than ImportError
        return f"{module} is not importable on this host ({type(exc).__name__}: {exc})"
    return None


def unavailable_reason(backend: str) -> str | None:
    """None when this host can run `backend`; otherwise why it cannot."""
    if backend in ("torchvision", "onnxruntime"):
        return _import_error(backend)
    module = {"tensorrt": "tensorrt", "tensorrt-llm": "tensorrt_llm"}[backend]
    reason = _import_error(module)
    if reason is None and not _has_cuda_gpu():
        reason = f"{module} imports but no CUDA GPU is visible"
    return reason


def _has_cuda_gpu() -> bool:
    """Asks the CUDA driver itself (libcuda's cuInit and cuDeviceGetCount), as torch.cuda.is_available() does,
    without importing torch: the runtime path stays free of it."""
    try:
        driver = ctypes.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return driver.cuInit(0) == 0 and driver.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
