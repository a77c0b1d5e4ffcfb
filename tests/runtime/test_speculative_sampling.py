"""Speculative sampling keeps the target's distribution: chi-square tests on a tiny vocabulary, against exact
probabilities and against the plain sampler's own draws, for a point-mass draft (prompt lookup) and a draft with a
distribution of its own."""

import numpy as np
import pytest
from scipy.stats import chi2, chi2_contingency, chisquare

from mmtrt.runtime.sampling import Sampler, SamplingParams
from mmtrt.runtime.speculative_drafts import lookup
from mmtrt.runtime.speculative_sampling import accept_or_resample, probabilities, verify_sampled

VOCAB, DRAWS, ALPHA = 6, 20000, 1e-4


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("case", range(4))
def test_a_draft_with_its_own_distribution_yields_the_target_distribution(case):
    rng = np.random.default_rng(case)
    p, q = softmax(rng.normal(size=VOCAB) * 1.5), softmax(rng.normal(size=VOCAB) * 1.5)
    counts = np.zeros(VOCAB)
    for seed in range(DRAWS):  # one generator per seed, as each request owns one
        gen = np.random.Generator(np.random.PCG64(seed + 10**6 * case))
        drafted = int(gen.choice(VOCAB, p=q))
        counts[accept_or_resample(p, drafted, gen, q)[0]] += 1
    assert chisquare(counts, DRAWS * p).pvalue > ALPHA


@pytest.mark.parametrize("drafted", [0, 3])
def test_a_point_mass_draft_yields_the_target_distribution_and_is_kept_with_probability_p(drafted):
    p = softmax(np.random.default_rng(5).normal(size=VOCAB) * 2)
    counts, kept = np.zeros(VOCAB), 0
    for seed in range(DRAWS):
        token, was_kept, _ = accept_or_resample(p, drafted, np.random.Generator(np.random.PCG64(seed)))
        counts[token] += 1
        kept += was_kept
        assert was_kept == (token == drafted)  # a rejected draft is never drawn again from the residual
    assert chisquare(counts, DRAWS * p).pvalue > ALPHA
    assert abs(kept / DRAWS - p[drafted]) < 4 * np.sqrt(p[drafted] * (1 - p[drafted]) / DRAWS)


def test_a_draft_the_target_cannot_produce_is_always_rejected():
    p = np.array([0.5, 0.5, 0, 0, 0, 0])
    for seed in range(200):
        token, kept, _ = accept_or_resample(p, 4, np.random.Generator(np.random.PCG64(seed)))
        assert not kept and token in (0, 1)


PARAMS = [SamplingParams(temperature=0.8, seed=0), SamplingParams(temperature=1.3, top_k=4, seed=0),
          SamplingParams(temperature=0.9, top_p=0.85, seed=0),
          SamplingParams(temperature=1.0, repetition_penalty=1.5, seed=0)]


@pytest.mark.parametrize("params", PARAMS, ids=["temperature", "top_k", "top_p", "penalty"])
def test_speculative_sampling_matches_the_plain_samplers_draws(params):
    """Plain `Sampler.choose` draws and `verify_sampled` with a point-mass draft come from one distribution
    (chi-square homogeneity), and `probabilities` is the distribution the plain draws follow."""
    logits = np.random.default_rng(3).normal(size=VOCAB).astype(np.float32)
    prompt = [1, 2]
    plain, spec = np.zeros(VOCAB), np.zeros(VOCAB)
    for seed in range(DRAWS // 2):
        seeded = SamplingParams(**{**params.__dict__, "seed": seed})
        plain[Sampler(seeded, prompt, VOCAB).choose(logits)[0]] += 1
        spec[verify_sampled(Sampler(seeded, prompt, VOCAB), logits, seed % VOCAB)[0]] += 1
    nonzero = (plain + spec) > 0
    assert chi2_contingency(np.stack([plain[nonzero], spec[nonzero]])).pvalue > ALPHA
    x = logits.astype(np.float64)
    if params.repetition_penalty != 1:
        x[prompt] = np.where(x[prompt] > 0, x[prompt] / params.repetition_penalty, x[prompt] * params.repetition_penalty)
    p = probabilities(x, params.temperature, params.top_k, params.top_p)
    kept = p > 0
    assert chisquare(plain[kept], plain.sum() * p[kept]).pvalue > ALPHA and plain[~kept].sum() == 0


def test_the_chi_square_bound_rejects_a_wrong_distribution():
    """The test's power: the draft's own distribution q is told apart from p at this sample size."""
    rng = np.random.default_rng(0)
    p, q = softmax(rng.normal(size=VOCAB) * 1.5), softmax(rng.normal(size=VOCAB) * 1.5)
    counts = np.bincount(rng.choice(VOCAB, size=DRAWS, p=q), minlength=VOCAB)
    assert chisquare(counts, DRAWS * p).statistic > chi2.ppf(1 - ALPHA, VOCAB - 1)


def test_lookup_proposes_what_followed_the_latest_full_match_of_the_longest_suffix():
    context = [7, 1, 2, 3, 4, 9, 1, 2, 5, 6, 1, 2]
    assert lookup(context, 3, max_ngram=3) == [5, 6, 1]  # "1 2" last seen before "5 6"; no earlier "6 1 2"
    assert lookup(context, 5, max_ngram=3) == [3, 4, 9, 1, 2]  # only the first "1 2" has 5 tokens after it
    assert lookup([5, 4, 4, 4, 4, 4, 4], 3, max_ngram=3) == [4, 4, 4]  # a run: not its own last step's 1 token
    assert lookup([1, 2, 1, 2, 1, 2], 4, max_ngram=3) == [1, 2]  # nothing has 4 after it: the most there is
    assert lookup(context + [3], 2, max_ngram=3) == [4, 9]  # the 3-token suffix first
    assert lookup([1, 2, 3], 4, max_ngram=3) == []  # nothing repeats
    assert lookup([5, 8, 8, 8, 0, 5], 3, max_ngram=2, skip_token=8) == []  # cut before the image placeholder
