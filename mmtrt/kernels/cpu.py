"""The CPU twins of the plugin kernels, called through ctypes: the reference the tests hold against numpy, and
the same arithmetic the CUDA kernels run (mmtrt/kernels/csrc)."""

from __future__ import annotations

import ctypes
import math
from functools import lru_cache

import ml_dtypes
import numpy as np

from mmtrt.kernels.build import cpu_twin

DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(ml_dtypes.bfloat16): 2}
_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


@lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(cpu_twin()))
    lib.mmtrt_token_select_cpu.argtypes = [_I, _P, _P, _P, *[_I] * 9, _F, _I, _P, _P, _P, _P]
    lib.mmtrt_token_select_scored_cpu.argtypes = [_I, _P, _P, *[_I] * 5, _F, _P, _P, _P]
    lib.mmtrt_int4_gemm_cpu.argtypes = [_I, _I, _P, _P, _P, _P, _I, _I, _I, _I, _P]
    lib.mmtrt_token_select_smem_bytes.argtypes = [_I] * 5
    lib.mmtrt_scored_smem_bytes.argtypes = [_I] * 2
    lib.mmtrt_round_cpu.argtypes = [_I, _P, _P, ctypes.c_longlong]
    lib.mmtrt_round_cpu.restype = None
    return lib


def _code(*arrays: np.ndarray) -> int:
    kinds = {a.dtype for a in arrays}
    if len(kinds) != 1 or next(iter(kinds)) not in DTYPES:
        raise ValueError(f"the kernels take one of float32, float16, bfloat16 for all of these, got {sorted(map(str, kinds))}")
    return DTYPES[arrays[0].dtype]


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def token_select(q: np.ndarray, k: np.ndarray, features: np.ndarray, keep: int, cls: int,
                 scale: float | None = None, target_at: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(selected features [n, keep, dim], scores [n, tokens] float32, indices [n, keep] int32: the kept patches,
    then with `target_at` (VisionZip's merge: positions among the dropped patches) each contextual token's target)."""
    targets = np.ascontiguousarray(np.zeros(0) if target_at is None else target_at, np.int32)
    q, k, features = (np.ascontiguousarray(a) for a in (q, k, features))
    n, heads, q_len, head_dim = q.shape
    kv_len, (_, tokens, dim) = k.shape[2], features.shape
    scale = 1 / math.sqrt(head_dim) if scale is None else scale
    out = np.empty((n, keep, dim), features.dtype)
    scores, indices = np.empty((n, tokens), np.float32), np.empty((n, keep), np.int32)
    rc = library().mmtrt_token_select_cpu(_code(q, k, features), _ptr(q), _ptr(k), _ptr(features), n, heads, q_len,
                                          kv_len, head_dim, cls, tokens, dim, keep, scale, targets.size, _ptr(targets),
                                          _ptr(out), _ptr(scores), _ptr(indices))
    if rc:
        raise ValueError(f"token_select: keep {keep} of {tokens} tokens after {cls} with {kv_len} keys and "
                         f"{targets.size} contextual targets is not a selection")
    return out, scores, indices


def token_select_scored(scores: np.ndarray, features: np.ndarray, keep: int, least: int | None = None,
                        mass: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(selected [n, keep, dim], count [n] int32, indices [n, keep] int32: the patch in each row) from fp32 scores
    [n, tokens]. mass 0: the `keep` best patches in spatial order; otherwise a dynamic budget whose most is `keep`:
    the fewest best patches reaching mass x the total, clamped to [least, keep], the last patch in the rest."""
    scores = np.ascontiguousarray(scores, np.float32)
    features = np.ascontiguousarray(features)
    n, tokens, dim = features.shape
    least = keep if least is None else least
    out = np.empty((n, keep, dim), features.dtype)
    counts, indices = np.empty(n, np.int32), np.empty((n, keep), np.int32)
    if scores.shape != (n, tokens):
        raise ValueError(f"token_select_scored: scores {list(scores.shape)} do not fit features {list(features.shape)}")
    rc = library().mmtrt_token_select_scored_cpu(_code(features), _ptr(scores), _ptr(features), n, tokens, dim, keep,
                                                 least, mass, _ptr(out), _ptr(counts), _ptr(indices))
    if rc:
        raise ValueError(f"token_select_scored: keep {keep} (least {least}, mass {mass}) of {tokens} tokens is not a "
                         "selection")
    return out, counts, indices


def int4_gemm(x: np.ndarray, packed: np.ndarray, scales: np.ndarray, pre: np.ndarray, group: int) -> np.ndarray:
    """y [..., N] = (x * pre) @ dequant(W) for W int4 [K, N] held as `packed` int8 [K, N / 2] (row k's byte j: column
    2j in the low nibble, 2j + 1 in the high one), scales [G, N] in x's type or float32."""
    x, scales, pre = (np.ascontiguousarray(a) for a in (x, scales, pre))
    packed = np.ascontiguousarray(packed, np.int8)
    K, N = x.shape[-1], scales.shape[1]
    M = int(np.prod(x.shape[:-1]))
    if N % 2 or packed.shape != (K, N // 2) or scales.shape[0] != -(-K // group) or pre.shape != (K,):
        raise ValueError(f"int4_gemm: packed {list(packed.shape)}, scales {list(scales.shape)}, pre {list(pre.shape)} "
                         f"do not fit K {K}, N {N} (even), group {group}")
    y = np.empty((*x.shape[:-1], N), x.dtype)
    rc = library().mmtrt_int4_gemm_cpu(_code(x, pre), DTYPES[scales.dtype], _ptr(x), _ptr(packed), _ptr(scales),
                                       _ptr(pre), M, K, N, group, _ptr(y))
    if rc:
        raise ValueError(f"int4_gemm: scales in {scales.dtype} with activations in {x.dtype}; give them in the "
                         f"activations' type or float32")
    return y


def smem_bytes(kernel: str, **dims: int) -> int:
    """The dynamic shared memory the headers give a launch: kernel `token_select` (kv_len, tokens, keep, head_dim,
    contextual) or `scored` (tokens, rows)."""
    if kernel == "token_select":
        return library().mmtrt_token_select_smem_bytes(dims["kv_len"], dims["tokens"], dims["keep"], dims["head_dim"],
                                                       dims["contextual"])
    return library().mmtrt_scored_smem_bytes(dims["tokens"], dims["rows"])


def round_to(values: np.ndarray, dtype) -> np.ndarray:
    """float32 values stored in `dtype` and read back, by the kernels' own conversions."""
    values = np.ascontiguousarray(values, np.float32)
    out = np.empty_like(values)
    library().mmtrt_round_cpu(DTYPES[np.dtype(dtype)], _ptr(values), _ptr(out), values.size)
    return out
