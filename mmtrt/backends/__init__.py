"""Backends. Each heavy framework is imported lazily, so mmtrt imports and runs on hosts that lack it."""

from __future__ import annotations

import importlib


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
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
