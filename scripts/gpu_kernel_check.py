"""The plugin kernels on a CUDA GPU, without TensorRT: CuPy loads the cubin for this GPU or the PTX (which the driver
JIT-compiles), runs every kernel of mmtrt/kernels/csrc on fresh random inputs of several shapes in fp32, fp16 and
bf16 (INT4 packed two per byte for the GEMM), poisons each output first, and compares it with the CPU twin (the
same arithmetic, bit for bit) and with a float reference: the standard-op decomposition on the GPU for the
selections, a float32 GEMM of the dequantized weight for the INT4 GEMM. One of the steps of scripts/gpu_check.py.

The launches (grid, block, shared memory, scalar arguments) are mmtrt/kernels/launch.py's, the ones TensorRT's
plugins use. `--quick`: one small case per kernel and type, no timing (for compute-sanitizer, which slows every
access). `--roofline`: only the cases of docs/results/plugin-roofline.md, each launched ROOFLINE_LAUNCHES times in
that order, for Nsight Compute to time.

Usage: python scripts/gpu_kernel_check.py --kernels DIR [--image cubin|ptx] [--quick | --roofline]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import cupy as cp
import ml_dtypes
import numpy as np

from mmtrt.kernels import cpu, launch
from mmtrt.quant.int4 import quantize_groups
from passes.fusion.int4_gemm_match import int8_pairs
from passes.vision.token_prune import contextual_targets

TYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(ml_dtypes.bfloat16): "bf16"}
FLOATS = (np.float32, np.float16, ml_dtypes.bfloat16)
# (n, heads, tokens, cls, head_dim, dim, keep): DINOv2-S/14 at 224 px keeping 64, CLIP-L/14 at 336 px keeping 144,
# and an odd size (tokens and keep not multiples of the block)
TOKEN_CASES = [(1, 6, 256, 1, 64, 384, 64), (8, 6, 256, 1, 64, 384, 64), (1, 16, 576, 1, 64, 1024, 144),
               (3, 4, 100, 1, 32, 72, 7)]
# (n, tokens, dim, keep or most, least, mass): DINOv2-S's 256 patches, an odd size
SCORED_CASES = [(1, 256, 384, 128, 16, 0.9), (4, 256, 384, 64, 8, 0.5), (3, 100, 72, 9, 2, 0.7)]
# (rows, K, N): SmolLM2-135M's q_proj and down_proj, a 7B-class linear at decode rows 1 and 8, an odd size
GEMM_CASES = [(1, 576, 576), (8, 1536, 576), (1, 4096, 4096), (8, 4096, 4096), (3, 200, 130)]
QUICK = {"token": [(1, 2, 40, 1, 16, 24, 8)], "scored": [(2, 40, 24, 8, 2, 0.6)], "gemm": [(3, 256, 130)]}
# The cases of docs/results/plugin-roofline.md, in its rows' order (gpu_roofline.py reads them in this order)
ROOFLINE = [("TokenSelect", (1, 6, 256, 1, 64, 384, 64)), ("TokenSelectMerge", (1, 6, 256, 1, 64, 384, 64)),
            ("TokenSelectDynamic", (1, 256, 384, 128, 16, 0.9)), ("TokenSelect", (1, 16, 576, 1, 64, 1024, 144)),
            ("Int4GroupGemm", (1, 4096, 4096)), ("Int4GroupGemm", (8, 4096, 4096))]
ROOFLINE_LAUNCHES = 5


class Kernels:
    """The kernels of one image (the cubin for this GPU or the PTX) and how the check runs them."""

    def __init__(self, folder: Path, image: str, mode: str):
        major, minor = cp.cuda.Device().compute_capability[:1], cp.cuda.Device().compute_capability[1:]
        path = folder / ("kernels.ptx" if image == "ptx" else f"kernels.sm_{major}{minor}.cubin")
        if not path.is_file():
            sys.exit(f"no {path.name} in {folder}: run scripts/gpu_check.sh prepare and carry .gpu_check")
        self.module, self.mode, self.image = cp.RawModule(path=str(path)), mode, image

    def run(self, found: launch.Launch, inputs: list, outputs: list) -> float | None:
        """Launch once into poisoned outputs (every byte 0xFF: NaN in every float type); the median ms over 50 timed
        launches after 5 warm-ups in the full mode, None otherwise."""
        fn = self.module.get_function(found.kernel)
        args = (*inputs, *map(np.int32, found.args), *outputs)
        go = lambda: fn(found.grid, found.block, args, shared_mem=found.shared_mem)
        for out in outputs:
            out.view(cp.uint8).fill(0xFF)
        go()
        cp.cuda.Device().synchronize()
        if self.mode == "roofline":
            for _ in range(ROOFLINE_LAUNCHES - 1):
                go()
            cp.cuda.Device().synchronize()
        return timed(go) if self.mode == "full" else None


def timed(fn, repeat: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def raw(a: np.ndarray) -> cp.ndarray:
    return cp.asarray(a.view(np.uint16) if a.dtype.itemsize == 2 else a)


def host(out: cp.ndarray, dtype) -> np.ndarray:
    return cp.asnumpy(out).view(dtype)


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per leading index, whether every byte agrees."""
    return (np.ascontiguousarray(a).view(np.uint8) == np.ascontiguousarray(b).view(np.uint8)).reshape(len(a), -1).all(1)


def line(ok: bool, what: str, detail: str, ms: float | None) -> bool:
    print(f"{'ok' if ok else 'MISMATCH'} {what}: {detail}{'' if ms is None else f'; {ms * 1e3:.1f} us'}", flush=True)
    return ok


def decomposition(q, k, feats, keep, cls) -> np.ndarray:
    """token_prune's graph in CuPy ops: fp32 scores, top-k, spatial order, gather."""
    head_dim = q.shape[-1]
    qf, kf = cp.asarray(q.astype(np.float32)), cp.asarray(k.astype(np.float32))
    logits = cp.einsum("nhd,nhsd->nhs", qf[:, :, 0], kf) / math.sqrt(head_dim)
    w = cp.exp(logits - logits.max(-1, keepdims=True))
    scores = (w / w.sum(-1, keepdims=True)).mean(1)[:, cls:]
    idx = cp.sort(cp.argsort(-scores, axis=1)[:, :keep], axis=1)
    return host(cp.take_along_axis(raw(feats), idx[..., None], axis=1), feats.dtype)


def token_inputs(rng, case, dtype):
    n, heads, tokens, cls, head_dim, dim, keep = case
    q, k = (rng.standard_normal((n, heads, tokens + cls, head_dim)).astype(dtype) for _ in range(2))
    return q, k, rng.standard_normal((n, tokens, dim)).astype(dtype)


def check_token_select(kernels: Kernels, rng, cases, dtypes=FLOATS) -> bool:
    ok = True
    for case in cases:
        n, heads, tokens, cls, head_dim, dim, keep = case
        for dtype in dtypes:
            q, k, feats = token_inputs(rng, case, dtype)
            found = launch.token_select(q.shape, k.shape, feats.shape, keep, cls, 1 / math.sqrt(head_dim),
                                        TYPES[np.dtype(dtype)])
            out = cp.empty((n, keep, dim), raw(feats).dtype)
            ms = kernels.run(found, [raw(q), raw(k), raw(feats)], [out])
            got = host(out, dtype)
            twin, scores, _ = cpu.token_select(q, k, feats, keep, cls)
            order = np.sort(scores, axis=1)[:, ::-1]  # images whose keep-th and next score tie are undecided
            decided = (order[:, keep - 1] - (order[:, keep] if keep < tokens else -np.inf)) > 1e-5 * order[:, 0]
            reference = decomposition(q, k, feats, keep, cls)
            case_ok = bool(decided.any() and same_bits(got, twin)[decided].all()
                           and same_bits(got, reference)[decided].all())
            ok &= line(case_ok, f"TokenSelect n={n} H={heads} T={tokens} keep={keep} {TYPES[np.dtype(dtype)]}",
                       f"twin and decomposition bit-exact on the {int(decided.sum())}/{n} images without a tie at "
                       f"the keep-th score", ms)
    return ok


def check_token_select_merge(kernels: Kernels, rng, cases, dtypes=FLOATS) -> bool:
    """VisionZip's merge (10 contextual of the kept, or 2 of a small keep) against the CPU twin."""
    ok = True
    for case in cases:
        n, heads, tokens, cls, head_dim, dim, keep = case
        contextual = 10 if keep >= 64 else 2
        targets = contextual_targets(tokens - (keep - contextual), contextual)
        target_at, merged_at = (a.astype(np.int32) for a in targets)
        for dtype in dtypes:
            q, k, feats = token_inputs(rng, case, dtype)
            found = launch.token_select(q.shape, k.shape, feats.shape, keep, cls, 1 / math.sqrt(head_dim),
                                        TYPES[np.dtype(dtype)], contextual)
            out = cp.empty((n, keep, dim), raw(feats).dtype)
            ms = kernels.run(found, [raw(q), raw(k), raw(feats), cp.asarray(target_at), cp.asarray(merged_at)], [out])
            got = host(out, dtype).astype(np.float32)
            twin = cpu.token_select(q, k, feats, keep, cls, target_at=target_at)[0].astype(np.float32)
            dominant = keep - contextual
            case_ok = bool(np.array_equal(got[:, :dominant], twin[:, :dominant])
                           and np.allclose(got[:, dominant:], twin[:, dominant:], rtol=1e-2, atol=1e-2))
            ok &= line(case_ok, f"TokenSelectMerge n={n} T={tokens} keep={keep} contextual={contextual} "
                       f"{TYPES[np.dtype(dtype)]}", "dominant rows bit-exact, contextual within 1e-2 of the twin", ms)
    return ok


def check_scored(kernels: Kernels, rng, cases, dynamic: bool, dtypes=FLOATS) -> bool:
    """TokenSelectScored (a fixed keep) or TokenSelectDynamic (a count reaching the score mass, at most `most`)."""
    ok, name = True, "TokenSelectDynamic" if dynamic else "TokenSelectScored"
    for n, tokens, dim, keep, least, mass in cases:
        for dtype in dtypes:
            scores = rng.random((n, tokens), np.float32) ** 4  # skewed, so the mass reaches a count below `most`
            feats = rng.standard_normal((n, tokens, dim)).astype(dtype)
            suffix = TYPES[np.dtype(dtype)]
            found = (launch.token_select_dynamic(feats.shape, keep, least, mass, suffix) if dynamic
                     else launch.token_select_scored(feats.shape, keep, suffix))
            out, counts = cp.empty((n, keep, dim), raw(feats).dtype), cp.empty(n, cp.int32)
            ms = kernels.run(found, [cp.asarray(scores), raw(feats)], [out, counts] if dynamic else [out])
            twin, twin_counts, _ = (cpu.token_select_scored(scores, feats, keep, least, mass) if dynamic
                                    else cpu.token_select_scored(scores, feats, keep))
            case_ok = bool(same_bits(host(out, dtype), twin).all())
            if dynamic:
                case_ok &= bool((cp.asnumpy(counts) == twin_counts).all())
            ok &= line(case_ok, f"{name} n={n} T={tokens} keep={keep} {suffix}",
                       f"twin bit-exact{', counts ' + str(twin_counts.tolist()) if dynamic else ''}", ms)
    return ok


def check_int4_gemm(kernels: Kernels, rng, cases) -> bool:
    ok = True
    pairs = ((np.float32, np.float32), (np.float16, np.float32), (np.float16, np.float16),
             (ml_dtypes.bfloat16, np.float32), (ml_dtypes.bfloat16, ml_dtypes.bfloat16))
    for rows, K, N in cases:
        q, scales, _ = quantize_groups(rng.standard_normal((N, K)).astype(np.float32), 128)  # one weight per shape
        packed = int8_pairs(np.ascontiguousarray(q.T))  # the plugin's weight: int8 [K, N / 2]
        for dtype, scale_dtype in pairs if kernels.mode != "roofline" else pairs[2:3]:
            s = np.ascontiguousarray(scales.T).astype(scale_dtype)
            x = rng.standard_normal((rows, K)).astype(dtype)
            pre = rng.uniform(0.5, 2, K).astype(dtype)
            found = launch.int4_gemm(x.shape, s.shape, 128, TYPES[np.dtype(dtype)], TYPES[np.dtype(scale_dtype)])
            y = cp.empty((rows, N), raw(x).dtype)
            ms = kernels.run(found, [raw(x), cp.asarray(packed), raw(s), raw(pre)], [y])
            got = host(y, dtype)
            twin = cpu.int4_gemm(x, packed, s, pre, 128)
            w = q.T.astype(np.float64) * np.repeat(s.astype(np.float64), 128, axis=0)[:K]
            reference = (x.astype(np.float64) * pre.astype(np.float64)) @ w
            rel = float(np.linalg.norm(got.astype(np.float64) - reference) / np.linalg.norm(reference))
            bound = 1e-5 if dtype is np.float32 else 1e-2  # the output's own rounding
            case_ok = bool(same_bits(got, twin).all()) and rel < bound
            ok &= line(case_ok, f"Int4GroupGemm M={rows} K={K} N={N} x {TYPES[np.dtype(dtype)]} s "
                       f"{TYPES[np.dtype(scale_dtype)]}", f"twin bit-exact, |y - ref| / |ref| {rel:.1e} (< {bound})", ms)
    return ok


def roofline(kernels: Kernels, rng) -> bool:
    ok = True
    for name, case in ROOFLINE:
        if name == "TokenSelect":
            ok &= check_token_select(kernels, rng, [case], (np.float16,))
        elif name == "TokenSelectMerge":
            ok &= check_token_select_merge(kernels, rng, [case], (np.float16,))
        elif name == "TokenSelectDynamic":
            ok &= check_scored(kernels, rng, [case], True, (np.float16,))
        else:
            ok &= check_int4_gemm(kernels, rng, [case])
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernels", type=Path, required=True, help="folder with kernels.ptx and kernels.sm_XX.cubin")
    parser.add_argument("--image", choices=["cubin", "ptx"], default="cubin")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="one small case per kernel and type, no timing")
    mode.add_argument("--roofline", action="store_true", help="the roofline page's cases, for Nsight Compute")
    args = parser.parse_args(argv)
    kernels = Kernels(args.kernels, args.image, "quick" if args.quick else "roofline" if args.roofline else "full")
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {args.image} from {args.kernels}", flush=True)
    rng = np.random.default_rng()
    print(f"seed state {rng.bit_generator.state['state']['state']}")
    if args.roofline:
        return 0 if roofline(kernels, rng) else 1
    token, scored, gemm = ((QUICK["token"], QUICK["scored"], QUICK["gemm"]) if args.quick
                           else (TOKEN_CASES, SCORED_CASES, GEMM_CASES))
    ok = check_token_select(kernels, rng, token) & check_token_select_merge(kernels, rng, token)
    ok &= check_scored(kernels, rng, scored, False) & check_scored(kernels, rng, scored, True)
    ok &= check_int4_gemm(kernels, rng, gemm)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
