"""The plugin kernels on a CUDA GPU, without TensorRT: CuPy loads the cubin for this GPU (RawModule), runs each
kernel on random inputs and compares it with numpy, with the CPU twin, and with the standard-op decomposition run
on the GPU by CuPy; then times kernel and decomposition (CUDA events, medians). Part of scripts/gpu_check.sh.
NOT RUN YET: no GPU was lent to the session that wrote it.

The launches (grid, block, shared memory, scalar arguments) are mmtrt/kernels/launch.py's, the ones TensorRT's
plugins use. `--quick` runs one small case per kernel (for compute-sanitizer, which slows every access).

Usage: python scripts/gpu_kernel_check.py [--cubins DIR] [--quick]   (DIR: build/kernels/cuda-* or a bundle's plugins/)
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

TYPES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(ml_dtypes.bfloat16): "bf16"}
# (n, heads, tokens, cls, head_dim, dim, keep): DINOv2-S/14 at 224 px keeping 64, CLIP-L/14 at 336 px keeping 144
TOKEN_CASES = [(1, 6, 256, 1, 64, 384, 64), (8, 6, 256, 1, 64, 384, 64), (1, 16, 576, 1, 64, 1024, 144)]
# (rows, K, N): SmolLM2-135M's q_proj and down_proj, a 7B-class linear; decode rows 1 and 8
GEMM_CASES = [(1, 576, 576), (8, 1536, 576), (1, 4096, 4096), (8, 4096, 4096)]
H200_BYTES_PER_S, H200_FP16_FLOPS = 4.8e12, 989e12


def module(cubins: Path) -> cp.RawModule:
    major, minor = cp.cuda.Device().compute_capability[:1], cp.cuda.Device().compute_capability[1:]
    path = cubins / f"kernels.sm_{major}{minor}.cubin"
    if not path.is_file():
        sys.exit(f"no cubin for sm_{major}{minor} in {cubins}; the bundle targets sm_80, sm_86, sm_89, sm_90")
    return cp.RawModule(path=str(path))


def timed(fn, repeat: int = 50) -> float:
    """Median milliseconds of fn() over `repeat` runs after 5 warm-up runs."""
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


def token_select_gpu(mod, q, k, feats, keep, cls):
    n, heads, q_len, head_dim = q.shape
    kv, tokens, dim = k.shape[2], feats.shape[1], feats.shape[2]
    found = launch.token_select(q.shape, k.shape, feats.shape, keep, cls, 1 / math.sqrt(head_dim), TYPES[feats.dtype])
    fn = mod.get_function(found.kernel)
    dq, dk, df = raw(q), raw(k), raw(feats)
    out = cp.empty((n, keep, dim), df.dtype)
    args = (dq, dk, df, *map(np.int32, found.args), out)
    run = lambda: fn(found.grid, found.block, args, shared_mem=found.shared_mem)
    run()
    cp.cuda.Device().synchronize()
    result = cp.asnumpy(out).view(feats.dtype)

    def decomposition():  # token_prune's graph in CuPy ops: fp32 scores, top-k, sort, gather
        qf, kf = cp.asarray(q.astype(np.float32)), cp.asarray(k.astype(np.float32))
        logits = cp.einsum("nhd,nhsd->nhs", qf[:, :, 0], kf) / math.sqrt(head_dim)
        w = cp.exp(logits - logits.max(-1, keepdims=True))
        scores = (w / w.sum(-1, keepdims=True)).mean(1)[:, cls:]
        idx = cp.sort(cp.argsort(-scores, axis=1)[:, :keep], axis=1)
        return cp.take_along_axis(df, idx[..., None], axis=1)

    return result, timed(run), decomposition, timed(decomposition)


def check_token_select(mod, rng, cases) -> bool:
    ok = True
    for n, heads, tokens, cls, head_dim, dim, keep in cases:
        for dtype in (np.float16, ml_dtypes.bfloat16, np.float32):
            kv = tokens + cls
            q = rng.standard_normal((n, heads, kv, head_dim)).astype(dtype)
            k = rng.standard_normal((n, heads, kv, head_dim)).astype(dtype)
            feats = rng.standard_normal((n, tokens, dim)).astype(dtype)
            got, kernel_ms, decomposition, decomp_ms = token_select_gpu(mod, q, k, feats, keep, cls)
            twin, scores, _ = cpu.token_select(q, k, feats, keep, cls)
            order = np.sort(scores, axis=1)[:, ::-1]
            decided = (order[:, keep - 1] - (order[:, keep] if keep < tokens else -np.inf)) > 1e-5 * order[:, 0]
            same_twin = (got.view(np.uint8) == twin.view(np.uint8)).reshape(n, -1).all(1)
            same_decomp = (got.view(np.uint8) == cp.asnumpy(decomposition()).view(np.uint8)).reshape(n, -1).all(1)
            case_ok = bool(same_twin[decided].all() and same_decomp[decided].all())
            ok &= case_ok
            bytes_moved = (q[:, :, 0].nbytes + k.nbytes + 2 * keep * dim * n * feats.itemsize)
            print(f"TokenSelect n={n} H={heads} T={tokens} keep={keep} {TYPES[np.dtype(dtype)]:>4}: "
                  f"{'ok' if case_ok else 'MISMATCH'} (decided images {int(decided.sum())}/{n}); kernel "
                  f"{kernel_ms * 1e3:.1f} us vs decomposition {decomp_ms * 1e3:.1f} us ({decomp_ms / kernel_ms:.1f}x); "
                  f"{bytes_moved / (kernel_ms * 1e-3) / 1e9:.0f} GB/s")
    return ok


def check_token_select_merge(mod, rng) -> bool:
    """VisionZip's merge (54 dominant + 10 contextual of 256 patches) against the CPU twin."""
    from passes.vision.token_prune import contextual_targets

    ok = True
    n, heads, tokens, cls, head_dim, dim, keep, contextual = 4, 6, 256, 1, 64, 384, 64, 10
    target_at, merged_at = (a.astype(np.int32) for a in contextual_targets(tokens - (keep - contextual), contextual))
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32):
        kv = tokens + cls
        q = rng.standard_normal((n, heads, kv, head_dim)).astype(dtype)
        k = rng.standard_normal((n, heads, kv, head_dim)).astype(dtype)
        feats = rng.standard_normal((n, tokens, dim)).astype(dtype)
        found = launch.token_select(q.shape, k.shape, feats.shape, keep, cls, 1 / math.sqrt(head_dim),
                                    TYPES[np.dtype(dtype)], contextual)
        fn = mod.get_function(found.kernel)
        out = cp.empty((n, keep, dim), raw(feats).dtype)
        args = (raw(q), raw(k), raw(feats), cp.asarray(target_at), cp.asarray(merged_at),
                *map(np.int32, found.args), out)
        ms = timed(lambda: fn(found.grid, found.block, args, shared_mem=found.shared_mem))
        got = cp.asnumpy(out).view(dtype).astype(np.float32)
        twin = cpu.token_select(q, k, feats, keep, cls, target_at=target_at)[0].astype(np.float32)
        dominant = keep - contextual
        same = np.array_equal(got[:, :dominant], twin[:, :dominant])
        close = np.allclose(got[:, dominant:], twin[:, dominant:], rtol=1e-2, atol=1e-2)
        ok &= same and close
        print(f"TokenSelectMerge n={n} T={tokens} keep={keep} contextual={contextual} {TYPES[np.dtype(dtype)]:>4}: "
              f"{'ok' if same and close else 'MISMATCH'}; kernel {ms * 1e3:.1f} us")
    return ok


def check_int4_gemm(mod, rng, cases) -> bool:
    ok = True
    for rows, K, N in cases:
        for dtype, scale_dtype in ((np.float16, np.float32), (np.float16, np.float16), (ml_dtypes.bfloat16, ml_dtypes.bfloat16)):
            q, scales, _ = quantize_groups(rng.standard_normal((N, K)).astype(np.float32), 128)
            packed = int8_pairs(np.ascontiguousarray(q.T))  # the plugin's weight: int8 [K, N / 2]
            s = np.ascontiguousarray(scales.T).astype(scale_dtype)
            x = rng.standard_normal((rows, K)).astype(dtype)
            pre = rng.uniform(0.5, 2, K).astype(dtype)
            found = launch.int4_gemm(x.shape, s.shape, 128, TYPES[np.dtype(dtype)], TYPES[np.dtype(scale_dtype)])
            fn = mod.get_function(found.kernel)
            dx, dw, ds, dp = raw(x), cp.asarray(packed), raw(s), raw(pre)
            y = cp.empty((rows, N), dx.dtype)
            args = (dx, dw, ds, dp, *map(np.int32, found.args), y)
            kernel_ms = timed(lambda: fn(found.grid, found.block, args))
            got = cp.asnumpy(y).view(dtype)
            twin = cpu.int4_gemm(x, packed, s, pre, 128)
            w16 = cp.asarray((q.T.astype(np.float32) * np.repeat(s.astype(np.float32), 128, axis=0)[:K]).astype(np.float16))
            x16 = cp.asarray((x.astype(np.float32) * pre.astype(np.float32)).astype(np.float16))
            decomp_ms = timed(lambda: x16 @ w16)  # what TensorRT runs without the plugin: fp16 weight, GEMM
            reference = cp.asnumpy(x16.astype(cp.float32) @ w16.astype(cp.float32))
            same_twin = bool((got.view(np.uint16) == twin.view(np.uint16)).all())
            rel = float(np.abs(got.astype(np.float32) - reference).max() / np.abs(reference).max())
            case_ok = same_twin and rel < 1e-2
            ok &= case_ok
            weight_bytes = packed.nbytes + s.nbytes
            print(f"Int4GroupGemm M={rows} K={K} N={N} x {TYPES[np.dtype(dtype)]} s {TYPES[np.dtype(scale_dtype)]}: "
                  f"{'ok' if case_ok else 'MISMATCH'} (twin bit-exact {same_twin}, max rel vs fp16 GEMM {rel:.1e}); "
                  f"kernel {kernel_ms * 1e3:.1f} us vs dequantized fp16 GEMM {decomp_ms * 1e3:.1f} us; "
                  f"{weight_bytes / (kernel_ms * 1e-3) / 1e9:.0f} GB/s of weights ({H200_BYTES_PER_S / 1e9:.0f} peak)")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cubins", type=Path, help="folder with kernels.sm_XX.cubin (default: build them here)")
    parser.add_argument("--quick", action="store_true", help="one small case per kernel")
    args = parser.parse_args(argv)
    if args.cubins is None:
        from mmtrt.kernels.build import device_code
        args.cubins = device_code().folder
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cubins from {args.cubins}")
    mod, rng = module(args.cubins), np.random.default_rng(0)
    token_cases, gemm_cases = (TOKEN_CASES[:1], GEMM_CASES[:1]) if args.quick else (TOKEN_CASES, GEMM_CASES)
    ok = (check_token_select(mod, rng, token_cases) & check_token_select_merge(mod, rng)
          & check_int4_gemm(mod, rng, gemm_cases))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
