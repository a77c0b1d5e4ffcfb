"""The sampler against the definitions (vLLM's order, on fresh random logits), its ranges, and its generator."""

import numpy as np
import pytest

from mmtrt.errors import UserError
from mmtrt.runtime.sampling import Sampler, SamplingParams, draw, penalize

VOCAB = 300


def reference_distribution(logits, seen, temperature, top_k, top_p, penalty):
    """The probabilities the definitions give, written from them: penalty, temperature, top-k, softmax, top-p."""
    x = np.array(logits, np.float64)
    for t in seen:
        x[t] = x[t] / penalty if x[t] > 0 else x[t] * penalty
    x = x / temperature
    if 0 < top_k < len(x):
        kth_largest = sorted(x, reverse=True)[top_k - 1]
        x = np.where(x >= kth_largest, x, -np.inf)
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p < 1:
        kept, mass = np.zeros(len(p), bool), 0.0
        for t in sorted(range(len(p)), key=lambda t: -p[t]):  # most probable first, while the mass before < top_p
            if mass >= top_p:
                break
            kept[t], mass = True, mass + p[t]
        p = np.where(kept, p, 0)
        p /= p.sum()
    return p


def shares(x, temperature, top_k, top_p, draws):
    """How much of [0, 1) each token's interval covers, from evenly spaced uniform numbers."""
    counts = np.zeros(len(x))
    for u in (np.arange(draws) + 0.5) / draws:
        counts[draw(x.copy(), temperature, top_k, top_p, u)[0]] += 1
    return counts / draws


@pytest.mark.parametrize("temperature, top_k, top_p, penalty", [
    (1.0, 0, 1.0, 1.0), (0.7, 20, 1.0, 1.0), (1.3, 0, 0.8, 1.0), (0.9, 50, 0.6, 1.3), (1.0, -1, 0.95, 0.8)])
def test_each_token_is_drawn_with_the_probability_the_definitions_give(rng, temperature, top_k, top_p, penalty):
    logits = rng.normal(0, 2, 40).astype(np.float32)
    seen = rng.choice(40, 8, replace=False)
    want = reference_distribution(logits, seen, temperature, top_k, top_p, penalty)
    mask = np.zeros(40, bool)
    mask[seen] = True
    x = penalize(logits.astype(np.float64), mask, penalty)
    got = shares(x, temperature, top_k, top_p, draws=4000)
    np.testing.assert_allclose(got, want, atol=2 / 4000)  # an interval of length p holds p * 4000 +- 1 points
    assert (got[want == 0] == 0).all()


def test_a_seed_gives_the_same_tokens_and_its_generator_is_numpys_pcg64(rng):
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=int(rng.integers(2**63)))
    logits = rng.normal(0, 3, (40, VOCAB)).astype(np.float32)
    runs = []
    for _ in range(2):
        sampler = Sampler(params, [1, 2, 3], VOCAB)
        runs.append([sampler.choose(row)[0] for row in logits])
    assert runs[0] == runs[1] and len(set(runs[0])) > 5
    numpy_rng = np.random.Generator(np.random.PCG64(params.seed))
    assert runs[0] == [draw(row.astype(np.float64), 0.8, 40, 0.9, numpy_rng.random())[0] for row in logits]
    other = Sampler(SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=params.seed + 1), [], VOCAB)
    assert [other.choose(row)[0] for row in logits] != runs[0]


def test_top_k_1_and_temperature_0_are_greedy(rng):
    logits = rng.normal(0, 1, (30, VOCAB)).astype(np.float32)
    for params in (SamplingParams(temperature=1.5, top_k=1, seed=3), SamplingParams(temperature=0.0, top_p=0.1)):
        sampler = Sampler(params, [], VOCAB)
        assert [sampler.choose(row)[0] for row in logits] == [int(np.argmax(row)) for row in logits]
    assert SamplingParams().greedy and SamplingParams(top_k=5, top_p=0.5).greedy
    assert not SamplingParams(repetition_penalty=1.2).greedy


def test_the_repetition_penalty_covers_prompt_and_output_tokens(rng):
    logits = rng.normal(0, 1, VOCAB).astype(np.float32)
    order = np.argsort(-logits)
    prompt = [int(order[0])]  # the best token is in the prompt: a strong penalty makes the runner-up win
    sampler = Sampler(SamplingParams(repetition_penalty=50.0), prompt, VOCAB)
    assert logits[order[2]] > 0
    assert sampler.choose(logits)[0] == int(order[1])
    assert sampler.choose(logits)[0] == int(order[2])  # the output's own token now counts as seen too
    positive, negative = np.float64(3.0), np.float64(-3.0)
    x = penalize(np.array([positive, negative, positive]), np.array([True, True, False]), 1.5)
    assert list(x) == [2.0, -4.5, 3.0]


@pytest.mark.parametrize("field, value, allowed", [
    ("temperature", -0.1, "[0, 2]"), ("temperature", 2.5, "[0, 2]"), ("temperature", float("nan"), "[0, 2]"),
    ("top_p", 0.0, "(0, 1]"), ("top_p", 1.01, "(0, 1]"), ("top_k", -2, "0 or -1 for off"),
    ("top_k", 2.5, "integer >= 1"), ("seed", -1, "0..18446744073709551615"), ("seed", 2**64, "0..1844"),
    ("repetition_penalty", 0.0, "(0, inf)"), ("repetition_penalty", float("inf"), "(0, inf)"),
    ("max_new_tokens", 0, "1..32"), ("max_new_tokens", 33, "1..32"), ("stop", ("",), "non-empty strings"),
    ("temperature", True, "[0, 2]")])
def test_a_value_outside_its_range_is_refused_naming_the_field_and_range(field, value, allowed):
    with pytest.raises(UserError) as err:
        SamplingParams(**{field: value}).validate(max_new_limit=32)
    message = str(err.value)
    assert message.startswith(f"sampling: {field} ") and allowed in message and "\n" not in message


def test_allowed_values_pass_and_a_single_stop_string_is_one_stop():
    params = SamplingParams(max_new_tokens=32, temperature=2, top_p=1, top_k=-1, seed=2**64 - 1,
                            repetition_penalty=1.1, stop="###").validate(32)
    assert params.stop == ("###",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
