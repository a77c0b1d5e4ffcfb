"""How the C++ runtime's tests reach it: the mmtrt-run program and libmmtrt.so of MMTRT_CPP_BUILD (default
build/cpp, which `make cpp` writes), the C API through ctypes, and images written to files."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("MMTRT_CPP_BUILD", ROOT / "build" / "cpp"))
PROGRAM = BUILD / "mmtrt-run"
# An ASan build cannot be loaded into an uninstrumented Python; its C API is exercised through the program.
SANITIZED = os.environ.get("MMTRT_CPP_SANITIZED") == "1"

needs_build = pytest.mark.skipif(not PROGRAM.is_file(), reason=f"{PROGRAM} is not built; run `make cpp`")
needs_library = pytest.mark.skipif(SANITIZED or not (BUILD / "libmmtrt.so").is_file(),
                                   reason="the C API is loaded with ctypes only from an uninstrumented build")


ERROR_PREFIX = "mmtrt-run: error: "


def one_line_error(proc) -> str:
    """mmtrt-run's bad-input message: exit code 2, nothing on stdout, one line on stderr."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR_PREFIX), proc.stderr
    return lines[0][len(ERROR_PREFIX):]


def python_message(call) -> str:
    """The Python runtime's UserError message for the same input."""
    from mmtrt.errors import UserError

    with pytest.raises(UserError) as info:
        call()
    return str(info.value)


def run_cpp(bundle, image, prompt, *extra, threads=1):
    args = [str(PROGRAM), str(bundle), "--image", str(image), "--prompt", prompt, "--threads", str(threads), *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def generate_cpp(bundle, image, prompt, *extra) -> dict:
    proc = run_cpp(bundle, image, prompt, "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


class CApi:
    """The few C functions the tests call; each returns the status and the library's message."""

    def __init__(self):
        lib = ctypes.CDLL(str(BUILD / "libmmtrt.so"))
        P, S = ctypes.c_void_p, ctypes.c_size_t
        lib.mmtrt_last_error.restype = ctypes.c_char_p
        lib.mmtrt_bundle_load.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(P)]
        lib.mmtrt_bundle_free.argtypes = [P]
        lib.mmtrt_generate.argtypes = [P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                       ctypes.POINTER(P)]
        lib.mmtrt_generation_json.argtypes = [P]
        lib.mmtrt_generation_json.restype = ctypes.c_char_p
        lib.mmtrt_generation_free.argtypes = [P]
        lib.mmtrt_prompt_ids.argtypes = [P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int32), S,
                                         ctypes.POINTER(S)]
        lib.mmtrt_pixel_values.argtypes = [P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_float), S, ctypes.POINTER(S)]
        lib.mmtrt_decode.argtypes = [P, ctypes.POINTER(ctypes.c_int32), S, ctypes.c_char_p, S, ctypes.POINTER(S)]
        self.lib = lib

    def error(self) -> str:
        return self.lib.mmtrt_last_error().decode()

    def load(self, bundle, threads=1, spin=True):
        handle = ctypes.c_void_p()
        status = self.lib.mmtrt_bundle_load(str(bundle).encode(), threads, int(spin), ctypes.byref(handle))
        return status, handle

    def generate(self, handle, image, prompt, max_new_tokens=0, raw=False):
        out = ctypes.c_void_p()
        status = self.lib.mmtrt_generate(handle, str(image).encode(), prompt.encode(), max_new_tokens, int(raw),
                                         ctypes.byref(out))
        if status:
            return status, None
        result = json.loads(self.lib.mmtrt_generation_json(out))
        self.lib.mmtrt_generation_free(out)
        return status, result

    def _sized(self, call, ctype):
        count = ctypes.c_size_t()
        call(None, 0, ctypes.byref(count))  # asks for the size: fails with ARGUMENT unless the result is empty
        buf = (ctype * max(count.value, 1))()
        status = call(buf, count.value, ctypes.byref(count))
        return status, list(buf[:count.value])

    def prompt_ids(self, handle, prompt, raw=False):
        return self._sized(lambda b, n, c: self.lib.mmtrt_prompt_ids(handle, prompt.encode(), int(raw), b, n, c),
                           ctypes.c_int32)

    def pixel_values(self, handle, image):
        status, values = self._sized(lambda b, n, c: self.lib.mmtrt_pixel_values(handle, str(image).encode(), b, n, c),
                                     ctypes.c_float)
        return status, np.array(values, np.float32)

    def decode(self, handle, ids) -> str:
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        length = ctypes.c_size_t()
        self.lib.mmtrt_decode(handle, arr, len(ids), None, 0, ctypes.byref(length))
        buf = ctypes.create_string_buffer(length.value + 1)
        assert self.lib.mmtrt_decode(handle, arr, len(ids), buf, length.value + 1, ctypes.byref(length)) == 0
        return buf.raw[:length.value].decode()

    def free(self, handle):
        self.lib.mmtrt_bundle_free(handle)
