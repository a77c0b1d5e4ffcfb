"""How the next token is chosen from one position's logits: vLLM's `SamplingParams` names, OpenAI's semantics.

The order is vLLM's: the repetition penalty on the logit of every token seen (prompt and output: a positive logit
divided by it, a negative one multiplied), then the argmax when temperature is 0 (greedy, the default); else the
logits divided by the temperature, top-k (the tokens at or above the k-th largest logit), softmax, top-p (the most
probable tokens, in descending order, while the mass before each is under top_p of the whole), and one uniform draw
u from the sequence's own generator: the first token whose cumulative weight exceeds u times the kept weight.

Each sequence owns its generator (numpy's PCG64 seeded with SeedSequence(seed); fresh entropy without a seed), so a
seed gives the same tokens alone or batched. Weights are float64 and summed left to right (np.cumsum), in ascending
token id order, or descending logit order (stable) under top-p: the C++ runtime's sampler repeats the generator,
the order and the arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mmtrt.errors import UserError

SEED_LIMIT = 2**64  # seeds are unsigned 64-bit integers, as the C++ runtime and the C API take them


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler. `max_new_tokens` None: the bundle's envelope.max_new_tokens; `top_k` 0
    or -1: off; `stop`: strings that end the text (not included in it); a single string is taken as one stop."""

    max_new_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        """Today's greedy decoding, bit for bit: argmax of the raw logits, no generator draws."""
        return self.temperature == 0 and self.repetition_penalty == 1

    def validate(self, max_new_limit: int | None = None) -> SamplingParams:
        """Raise UserError naming the first field outside its range; `max_new_limit` is the bundle's KV budget."""
        _check_int("max_new_tokens", self.max_new_tokens, 1, max_new_limit, optional=True,
                   fix="recompile with a larger envelope.max_new_tokens" if max_new_limit else "")
        _check_float("temperature", self.temperature, 0, 2, "[0, 2] (0: greedy)", low_open=False)
        _check_float("top_p", self.top_p, 0, 1, "(0, 1]", low_open=True)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) or self.top_k < -1:
            raise UserError(f"sampling: top_k {self.top_k!r} is not allowed; pass an integer >= 1, or 0 or -1 for off")
        _check_int("seed", self.seed, 0, SEED_LIMIT - 1, optional=True)
        _check_float("repetition_penalty", self.repetition_penalty, 0, math.inf, "(0, inf) (1: off)", low_open=True)
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise UserError(f"sampling: stop {self.stop!r} is not allowed; pass non-empty strings")
        return self


def _check_int(name, value, low, high, optional=False, fix=""):
    if optional and value is None:
        return
    bad = isinstance(value, bool) or not isinstance(value, (int, np.integer))
    if bad or value < low or (high is not None and value > high):
        allowed = f"{low}..{high}" if high is not None else f">= {low}"
        raise UserError(f"sampling: {name} {value!r} is outside {allowed}; pass an integer in that range"
                        + (f" or {fix}" if fix else ""))


def _check_float(name, value, low, high, allowed, low_open):
    bad = isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer))
    if bad or not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        raise UserError(f"sampling: {name} {value!r} is outside {allowed}; pass a number in that range")


class Sampler:
    """One sequence's choices: its parameters, its generator and the tokens it has seen (for the penalty)."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int], vocab: int):
        self.params = params
        self.rng = np.random.Generator(np.random.PCG64(params.seed))
        self.seen = np.zeros(vocab, bool)
        if params.repetition_penalty != 1:
            self.seen[np.asarray(prompt_ids, np.int64)] = True

    def choose(self, logits: np.ndarray) -> tuple[int, float]:
        """The next token of one position's logits [vocab] and how near the choice was to flipping: the top-2
        logit margin when greedy, else the draw's distance to its interval's ends as a share of the kept weight."""
        p = self.params
        x = penalize(logits.astype(np.float64), self.seen, p.repetition_penalty)
        if p.temperature == 0:
            token, margin = _argmax_margin(x)
        else:
            token, margin = draw(x, p.temperature, p.top_k, p.top_p, self.rng.random())
        self.seen[token] = True
        return token, margin


def penalize(x: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    if penalty != 1:
        x[seen] = np.where(x[seen] > 0, x[seen] / penalty, x[seen] * penalty)
    return x


def kept(x: np.ndarray, temperature: float, top_k: int, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The token ids that temperature, top-k and top-p keep from penalized float64 logits `x`, with their
    unnormalised weights (in descending order of logit when top-p cut them)."""
    x = x / temperature
    ids = np.arange(len(x))
    if 0 < top_k < len(x):
        kth = np.partition(x, len(x) - top_k)[len(x) - top_k]
        ids = np.flatnonzero(x >= kth)
    weights = np.exp(x[ids] - x[ids].max())
    if top_p < 1:
        order = np.argsort(-x[ids], kind="stable")
        ids, weights = ids[order], weights[order]
        cumulative = np.cumsum(weights)
        before = np.concatenate([[0.0], cumulative[:-1]])
        keep = int(np.count_nonzero(before < top_p * cumulative[-1]))
        ids, weights = ids[:keep], weights[:keep]
    return ids, weights


def draw(x: np.ndarray, temperature: float, top_k: int, top_p: float, u: float) -> tuple[int, float]:
    """Sample from penalized float64 logits `x` with the uniform number `u` in [0, 1)."""
    ids, weights = kept(x, temperature, top_k, top_p)
    cumulative = np.cumsum(weights)
    target = u * cumulative[-1]
    at = min(int(np.searchsorted(cumulative, target, side="right")), len(ids) - 1)
    low = cumulative[at - 1] if at else 0.0
    return int(ids[at]), float(min(target - low, cumulative[at] - target) / cumulative[-1])


def _argmax_margin(x: np.ndarray) -> tuple[int, float]:
    best = int(np.argmax(x))
    second = max(x[:best].max(initial=-np.inf), x[best + 1:].max(initial=-np.inf))
    return best, float(x[best] - second)
