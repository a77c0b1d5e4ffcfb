"""Speculative sampling: a draft's token kept or replaced so that the output follows the target's distribution.

Standard speculative sampling (Leviathan et al., Chen et al.): the draft proposed token t with probability q(t);
the target's distribution at that position is p. t is kept with probability min(1, p(t) / q(t)); otherwise the
token is drawn from the residual max(0, p - q), normalised. Whatever q is, the token then follows p exactly. A
draft that proposes without a distribution (prompt lookup) is a point mass: t is kept with probability p(t), and
the residual is p with t removed. Greedy decoding keeps t exactly when it is the argmax, so it never draws.

p is the sampler's own distribution (sampling.py): the repetition penalty on the tokens seen, the temperature,
top-k and top-p, with the same kept set and weights as `draw`.
"""

from __future__ import annotations

import numpy as np

from mmtrt.runtime.sampling import Sampler, kept, penalize


def probabilities(x: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The distribution `draw` samples from, over the whole vocabulary (0 outside its kept set), from penalized
    float64 logits `x`."""
    ids, weights = kept(x, temperature, top_k, top_p)
    p = np.zeros(len(x))
    p[ids] = weights / weights.sum()
    return p


def accept_or_resample(p: np.ndarray, token: int, rng: np.random.Generator,
                       q: np.ndarray | None = None) -> tuple[int, bool, float]:
    """The token at a drafted position: (token, whether the draft's was kept, the accept draw's distance to its
    threshold). `q`: the draft's distribution, None for a point mass on `token`."""
    q_token = 1.0 if q is None else float(q[token])
    threshold = min(1.0, float(p[token]) / q_token) if q_token > 0 else 0.0
    u = rng.random()
    if u < threshold:
        return token, True, threshold - u
    residual = np.maximum(p - (np.eye(1, len(p), token)[0] if q is None else q), 0.0)
    if residual.sum() <= 0:  # p equals q: a rejection has probability 0, kept for the arithmetic's edge
        residual = p
    cumulative = np.cumsum(residual)
    at = min(int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")), len(p) - 1)
    return at, False, u - threshold


def verify_sampled(sampler: Sampler, logits: np.ndarray, token: int,
                   q: np.ndarray | None = None) -> tuple[int, bool, float]:
    """`accept_or_resample` with the sequence's sampler: its penalty, temperature, top-k, top-p and generator;
    the chosen token counts as seen."""
    params = sampler.params
    x = penalize(logits.astype(np.float64), sampler.seen, params.repetition_penalty)
    p = probabilities(x, params.temperature, params.top_k, params.top_p)
    chosen, kept, margin = accept_or_resample(p, token, sampler.rng, q)
    sampler.seen[chosen] = True
    return chosen, kept, margin
