"""The CPU twins of the plugin kernels against numpy, on fresh random inputs and the edge cases."""

import math

import ml_dtypes
import numpy as np
import pytest
from onnx import numpy_helper

from mmtrt.kernels import cpu
from mmtrt.quant.int4 import dequantize_groups, quantize_groups

BF16 = ml_dtypes.bfloat16


def ref_scores(q, k, cls, tokens, scale):
    """token_prune's score: softmax(q_cls K^T * scale) per head, mean over heads, the patch columns."""
    q, k = q.astype(np.float64), k.astype(np.float64)
    logits = np.einsum("nhd,nhsd->nhs", q[:, :, 0], k) * scale
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w.mean(1)[:, cls:cls + tokens]


def ref_select(scores, keep):
    """ONNX TopK (ties: the lower index first), then the kept indices ascending."""
    order = np.argsort(-scores, axis=1, kind="stable")[:, :keep]
    return np.sort(order, axis=1)


def inputs(rng, n, heads, tokens, cls, head_dim, dim, dtype):
    kv = tokens + cls
    q = rng.standard_normal((n, heads, kv, head_dim)).astype(dtype)
    k = rng.standard_normal((n, heads, kv, head_dim)).astype(dtype)
    feats = rng.standard_normal((n, tokens, dim)).astype(dtype)
    return q, k, feats


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("n,tokens,cls,keep", [(1, 64, 1, 16), (3, 49, 0, 7), (2, 100, 1, 100), (8, 300, 1, 1)])
def test_token_select_matches_numpy(dtype, n, tokens, cls, keep):
    rng = np.random.default_rng()
    q, k, feats = inputs(rng, n, 6, tokens, cls, 16, 24, dtype)
    scale = 1 / math.sqrt(16)
    out, scores, idx = cpu.token_select(q, k, feats, keep, cls)
    expect = ref_scores(q.astype(np.float32), k.astype(np.float32), cls, tokens, scale)
    np.testing.assert_allclose(scores, expect, rtol=1e-5, atol=1e-9)
    np.testing.assert_array_equal(idx, ref_select(scores.astype(np.float64), keep))
    # where the float64 ranking is decided by more than the float32 rounding, it must agree too
    sorted_scores = np.sort(expect, axis=1)[:, ::-1]
    margin = sorted_scores[:, keep - 1] - (sorted_scores[:, keep] if keep < tokens else -np.inf)
    safe = margin > 1e-5 * sorted_scores[:, 0]
    np.testing.assert_array_equal(idx[safe], ref_select(expect, keep)[safe])
    gathered = np.take_along_axis(feats, idx[..., None].astype(np.int64), axis=1)
    np.testing.assert_array_equal(out.view(np.uint8), gathered.view(np.uint8))


def test_token_select_ties_keep_the_lower_index():
    """Equal keys give exactly equal scores; TopK then keeps the lower patch index, as ONNX orders ties."""
    rng = np.random.default_rng()
    q, k, feats = inputs(rng, 2, 4, 40, 1, 8, 8, np.float32)
    k[:, :, 1 + 5] *= 10  # long enough that no random key outscores it
    k[:, :, 1 + 20] = k[:, :, 1 + 5]  # patches 5 and 20 share a key
    k[:, :, 1 + 30] = k[:, :, 1 + 5]
    q[:, :, 0] = k[:, :, 1 + 5] * 4  # and [CLS] attends to it most
    _, scores, idx = cpu.token_select(q, k, feats, 2, 1)
    assert (scores[:, 5] == scores[:, 20]).all() and (scores[:, 5] == scores[:, 30]).all()
    np.testing.assert_array_equal(idx, [[5, 20], [5, 20]])


def test_token_select_refuses_a_keep_beyond_the_tokens():
    q, k, feats = inputs(np.random.default_rng(), 1, 2, 10, 1, 4, 4, np.float32)
    with pytest.raises(ValueError, match="keep 11 of 10"):
        cpu.token_select(q, k, feats, 11, 1)


def int8_pairs(q_kn: np.ndarray) -> np.ndarray:
    """The plugin's weight: int8 [K, N / 2], byte j of row k = column 2j (low nibble) | column 2j + 1 (high)."""
    nibbles = q_kn.astype(np.int16) & 15
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).astype(np.uint8).view(np.int8)


def test_int8_pairs_are_the_bytes_of_onnx_int4():
    """For an even N the plugin's int8 weight holds the very bytes ONNX stores for the INT4 [K, N] initializer (the
    format spec, via onnx's own packer): fuse_plugins retypes the initializer without repacking."""
    q = np.random.default_rng().integers(-8, 8, size=(6, 10))
    onnx_bytes = np.frombuffer(numpy_helper.from_array(q.astype(ml_dtypes.int4)).raw_data, np.uint8)
    assert (int8_pairs(q).view(np.uint8).reshape(-1) == onnx_bytes).all()


def ref_int4(x, q, scales, pre, group, dtype):
    """(x * pre) @ (q * s), each product rounded to the activation type where the ONNX graph rounds it (q * s is
    computed in the scales' type, as DequantizeLinear does, then cast)."""
    round_t = lambda a: np.asarray(a, np.float32).astype(dtype).astype(np.float64)
    w = dequantize_groups(q, scales.T.astype(np.float32), None, group).astype(scales.dtype)  # [N, K]; scales [G, N]
    w = round_t(w)
    xs = round_t(x.astype(np.float32) * pre.astype(np.float32))
    return xs @ w.T


def ulp(values, dtype):
    mant = {np.dtype(np.float32): 23, np.dtype(np.float16): 10, np.dtype(BF16): 7}[np.dtype(dtype)]
    return np.exp2(np.floor(np.log2(np.maximum(np.abs(values), 1e-30))) - mant)


@pytest.mark.parametrize("dtype,scale_dtype", [(np.float32, np.float32), (np.float16, np.float16), (BF16, BF16),
                                               (np.float16, np.float32), (BF16, np.float32)])
@pytest.mark.parametrize("rows,K,N,group", [(1, 256, 128, 128), (8, 200, 136, 128), (9, 96, 64, 64), (3, 130, 20, 64)])
def test_int4_gemm_matches_numpy(dtype, scale_dtype, rows, K, N, group):
    rng = np.random.default_rng()
    w = rng.standard_normal((N, K)).astype(np.float32)
    q, scales, _ = quantize_groups(w, group)  # q [N, K], scales [N, G]
    x = rng.standard_normal((rows, K)).astype(dtype)
    pre = rng.uniform(0.5, 2.0, K).astype(dtype)
    s_t = np.ascontiguousarray(scales.T).astype(scale_dtype)  # [G, N]
    y = cpu.int4_gemm(x, int8_pairs(np.ascontiguousarray(q.T)), s_t, pre, group)
    expect = ref_int4(x, q, s_t, pre, group, dtype)
    # fp32 accumulation against float64: the error bound of a K-term sum, plus one rounding to the output type
    bound = K * 2.0 ** -23 * (np.abs(ref_int4(np.abs(x.astype(np.float32)).astype(dtype), np.abs(q), s_t, pre, group,
                                                dtype))) + ulp(expect, dtype)
    assert (np.abs(y.astype(np.float64) - expect) <= bound).all()


def test_int4_gemm_refuses_mixed_low_precision_scales():
    x = np.ones((1, 64), np.float16)
    with pytest.raises(ValueError, match="activations' type or float32"):
        cpu.int4_gemm(x, np.zeros((64, 4), np.int8), np.ones((1, 8), BF16), np.ones(64, np.float16), 64)


def test_int4_gemm_batch_dims_are_rows():
    rng = np.random.default_rng()
    q, scales, _ = quantize_groups(rng.standard_normal((64, 128)).astype(np.float32), 128)
    x = rng.standard_normal((2, 4, 128)).astype(np.float16)
    args = (int8_pairs(np.ascontiguousarray(q.T)), np.ascontiguousarray(scales.T).astype(np.float16),
            np.ones(128, np.float16), 128)
    np.testing.assert_array_equal(cpu.int4_gemm(x, *args).reshape(8, 64), cpu.int4_gemm(x.reshape(8, 128), *args))


@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_rounding_is_round_to_nearest_even(dtype):
    rng = np.random.default_rng()
    edge = np.array([0, -0.0, 65504, 65519.9, 65520, 1e-8, 5.96e-8, 2.98e-8, 6.1e-5, np.inf, -np.inf, 3e38, 1 + 2**-11,
                     1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8], np.float32)
    wide = rng.standard_normal(10000) * 10.0 ** rng.integers(-9, 6, 10000)
    values = np.concatenate([edge, wide.astype(np.float32)])
    np.testing.assert_array_equal(cpu.round_to(values, dtype), values.astype(dtype).astype(np.float32))
    nan = cpu.round_to(np.array([np.nan], np.float32), dtype)
    assert np.isnan(nan).all()


def ref_merge(q, k, feats, keep, contextual, cls, scale):
    """VisionZip as token_prune writes it: dominant patches, the dropped ones merged into contextual tokens."""
    from passes.vision.token_prune import contextual_targets

    n, tokens = feats.shape[:2]
    dominant, dropped = keep - contextual, tokens - (keep - contextual)
    scores = ref_scores(q, k, cls, tokens, scale)
    keys = k.astype(np.float64).mean(1)[:, cls:]
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    target_at, merged_at = contextual_targets(dropped, contextual)
    out, targets_of = [], []
    for b in range(n):
        order = np.argsort(-scores[b], kind="stable")
        kept, rest = np.sort(order[:dominant]), np.sort(order[dominant:])
        targets, merged = rest[target_at], rest[merged_at]
        nearest = np.argmax(keys[b, merged] @ keys[b, targets].T, axis=1)
        f = feats[b].astype(np.float64)
        ctx = [f[t] + (f[merged[nearest == c]].mean(0) if (nearest == c).any() else 0) for c, t in enumerate(targets)]
        out.append(np.concatenate([f[kept], np.stack(ctx)]))
        targets_of.append(np.concatenate([kept, targets]))
    return np.stack(out), np.stack(targets_of), target_at


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n,tokens,keep,contextual", [(2, 64, 16, 3), (1, 100, 30, 5), (3, 49, 48, 1)])
def test_token_select_merge_matches_visionzip(dtype, n, tokens, keep, contextual):
    rng = np.random.default_rng()
    q, k, feats = inputs(rng, n, 4, tokens, 1, 16, 20, dtype)
    expect, targets, target_at = ref_merge(q.astype(np.float32), k.astype(np.float32), feats, keep, contextual, 1, 0.25)
    out, _, idx = cpu.token_select(q, k, feats, keep, 1, target_at=target_at)
    np.testing.assert_array_equal(idx, targets)
    dominant = keep - contextual
    np.testing.assert_array_equal(out[:, :dominant], expect[:, :dominant].astype(dtype))
    # contextual rows: the sum in fp32 and three roundings to the feature type where the graph rounds
    tol = 1e-5 if dtype == np.float32 else 3 * 2.0 ** -10
    np.testing.assert_allclose(out[:, dominant:].astype(np.float64), expect[:, dominant:], rtol=tol, atol=tol)
