"""The CPU twin of TokenSelectScored and TokenSelectDynamic (token_budget.h) against numpy: fresh random scores,
ties, and the dynamic count's known answer (a mass reached at exactly k tokens keeps exactly k)."""

import ml_dtypes
import numpy as np
import pytest

from mmtrt.kernels import cpu


def ref_selection(scores, keep, least=None, mass=0.0):
    """numpy: ONNX TopK's order (ties: the lower index first); the count as token_prune's graph computes it, with
    the sums in fp32 in rank order; the kept patches in spatial order, then the last patch."""
    n, tokens = scores.shape
    rows, counts = np.full((n, keep), tokens - 1), []
    for b in range(n):
        order = np.argsort(-scores[b], kind="stable")
        count = keep
        if mass:
            ranked = scores[b, order].astype(np.float32)
            reached = np.cumsum(ranked, dtype=np.float32)
            count = int(np.clip(np.sum(reached < reached[-1] * np.float32(mass)) + 1, least, keep))
        rows[b, :count] = np.sort(order[:count])
        counts.append(count)
    return rows, np.array(counts)


def gathered(features, rows):
    return np.take_along_axis(features, rows[..., None], axis=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("n,tokens,keep", [(1, 64, 16), (3, 49, 7), (2, 100, 100), (9, 300, 1)])
def test_fixed_selection_matches_numpy(dtype, n, tokens, keep):
    rng = np.random.default_rng()
    scores = rng.random((n, tokens), dtype=np.float32)
    features = rng.standard_normal((n, tokens, 24)).astype(dtype)
    out, counts, rows = cpu.token_select_scored(scores, features, keep)
    expect, _ = ref_selection(scores, keep)
    np.testing.assert_array_equal(rows, expect)
    assert (counts == keep).all()
    np.testing.assert_array_equal(out.view(np.uint8), gathered(features, expect).view(np.uint8))


@pytest.mark.parametrize("mass,least,most", [(0.9, 1, 300), (0.5, 8, 64), (0.99, 1, 20), (0.2, 40, 120)])
def test_dynamic_selection_matches_numpy(mass, least, most):
    rng = np.random.default_rng()
    scores = rng.random((5, 300), dtype=np.float32) ** rng.uniform(1, 8, (5, 1)).astype(np.float32)  # varied peaks
    features = rng.standard_normal((5, 300, 16)).astype(np.float16)
    out, counts, rows = cpu.token_select_scored(scores, features, most, least, mass)
    expect_rows, expect_counts = ref_selection(scores, most, least, mass)
    np.testing.assert_array_equal(counts, expect_counts)
    np.testing.assert_array_equal(rows, expect_rows)
    np.testing.assert_array_equal(out.view(np.uint8), gathered(features, expect_rows).view(np.uint8))
    assert least <= counts.min() and counts.max() <= most


# distinct integer scores, total 100, whose top k sum to exactly 90 and top k - 1 to less
EXACT = {3: [40, 30, 20, 2, 1, 1, 1, 1, 1, 1, 1, 1], 7: [21, 17, 14, 12, 10, 9, 7, 4, 3, 1, 1, 1]}


@pytest.mark.parametrize("least,most,expect", [(1, 12, [3, 7]), (4, 12, [4, 7]), (1, 5, [3, 5])])
def test_the_mass_reached_at_exactly_k_tokens_keeps_exactly_those_k(least, most, expect):
    rng = np.random.default_rng()
    scores = np.stack([rng.permutation(np.array(EXACT[k], np.float32)) for k in (3, 7)])
    features = rng.standard_normal((2, 12, 3)).astype(np.float32)
    out, counts, rows = cpu.token_select_scored(scores, features, most, least, 0.9)
    assert counts.tolist() == expect
    for b, k in enumerate(expect):
        top = np.sort(np.argsort(-scores[b], kind="stable")[:k])
        np.testing.assert_array_equal(rows[b, :k], top)
        np.testing.assert_array_equal(out[b, :k], features[b, top])
        assert (rows[b, k:] == 11).all()


def test_ties_keep_the_lower_index():
    """Equal scores rank by index, as ONNX TopK orders them; the count cuts between equal scores the same way."""
    scores = np.array([[1, 5, 3, 5, 5, 0, 3, 1]], np.float32)  # total 23; 5 + 5 + 5 = 15 < 0.7 * 23 <= 18
    features = np.arange(8, dtype=np.float32).reshape(1, 8, 1)
    _, _, fixed = cpu.token_select_scored(scores, features, 2)
    assert fixed.tolist() == [[1, 3]]
    _, counts, rows = cpu.token_select_scored(scores, features, 8, 1, 0.7)
    assert counts.tolist() == [4] and rows[0, :4].tolist() == [1, 2, 3, 4]  # the first of the two 3s


@pytest.mark.parametrize("keep,least,mass", [(0, None, 0.0), (11, None, 0.0), (5, 6, 0.5), (5, 1, 1.5)])
def test_refuses_what_is_not_a_selection(keep, least, mass):
    features = np.zeros((1, 10, 2), np.float32)
    with pytest.raises(ValueError, match="is not a selection"):
        cpu.token_select_scored(np.ones((1, 10), np.float32), features, keep, least, mass)
