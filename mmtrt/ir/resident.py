"""Memory handed back to the system as soon as the compile is done with it: the pages of a mapped checkpoint
once a tensor of it is widened, and the heap's free pages once a pass or a layer's calibration freed them."""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

_PAGEOUT = 21  # MADV_PAGEOUT (Linux 5.4+): reclaim the pages now; clean file pages are read again when touched
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def release(tensor: torch.Tensor) -> None:
    """Hand back the whole pages under `tensor` when they map a file (a safetensors checkpoint); memory of the
    process's own (a model built in memory, a pickled checkpoint) is left alone, and so is every other system."""
    start = tensor.data_ptr()
    first, last = -(-start // _PAGE) * _PAGE, (start + tensor.numel() * tensor.element_size()) // _PAGE * _PAGE
    if last > first and tensor.is_contiguous() and _maps_file(first, last):
        _libc().madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), ctypes.c_int(_PAGEOUT))


def give_back_freed_memory() -> None:
    """glibc's malloc_trim: the free pages of every heap back to the system, which glibc does not shrink by itself;
    nothing where libc has no such call."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _maps_file(first: int, last: int) -> bool:
    """Whether [first, last) lies in one mapping of a file (/proc/self/maps: a non-zero inode)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if low <= first and last <= high:
            return len(fields) > 5 and fields[4] != "0"
    return False


@functools.cache
def _libc():
    return ctypes.CDLL(None)
