"""Speculative decoding: a draft proposes up to k tokens, the full LLM scores them in one call, the kept ones stay.

Per running sequence and step: the draft proposes d <= k tokens (never past the request's token limit); the last
token and the draft go through the LLM, every running sequence's in one call where the KV layout allows (paged;
static and hf: one call per sequence, speculative_kv.py says why), whose d + 1 positions give the target's choice
at each. Greedy keeps a drafted token exactly when it is the argmax, so the tokens equal plain decoding's;
sampling keeps it with speculative sampling's rule (speculative_sampling.py), so they follow the same
distribution. The first position that differs gives the target's own token, then the cache is cut back to the
positions kept. Each kept token is one event, as plain steps give, so EOS, stop strings and the limit end a
sequence inside an accepted run. A step where no sequence has a draft is the scheduler's plain batched step.

k adapts per sequence to its acceptance rate once k tokens were proposed (a mean accepted run of a / (1 - a) tokens
is expected, proposing one more than that, within 1..k). The bundle's manifest says which draft (`model.speculative`, written
by the `speculative` pass); `Pipeline.speculative` may be set to another configuration or None.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from mmtrt.runtime.batch import Sequence
from mmtrt.runtime.sampling import Sampler
from mmtrt.runtime.speculative_drafts import PromptLookup
from mmtrt.runtime.speculative_kv import verifier_for
from mmtrt.runtime.speculative_sampling import verify_sampled
from mmtrt.runtime.streaming import Delta


@dataclass
class Counts:
    """Drafted tokens proposed and accepted, for one request or a whole scheduler."""

    proposed: int = 0
    accepted: int = 0

    def add(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted

    @property
    def rate(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    def to_json(self) -> dict[str, int]:
        return {"proposed": self.proposed, "accepted": self.accepted}


def next_k(counts: Counts, k_max: int) -> int:
    """Proposals per step: k until k have been proposed, then from the acceptance rate so far (a prior of one
    accepted in two proposed)."""
    if counts.proposed < k_max:
        return k_max
    rate = (counts.accepted + 1) / (counts.proposed + 2)
    return max(1, min(k_max, math.ceil(rate / (1 - rate)) + 1))


def room(seq: Sequence) -> int:
    """Tokens a draft may propose: every kept one and the target's own after them fit the request's limit."""
    return seq.prep.limit - len(seq.tokens) - 1


def make_draft(pipe, config: dict):
    """The draft a configuration names, or the caller's own object (with `propose` and `commit`) given as draft."""
    if not isinstance(config["draft"], str):
        return config["draft"]
    if config["draft"] == "prompt_lookup":
        return PromptLookup(config["max_ngram"], pipe.model["image_token_id"])
    from mmtrt.runtime.speculative_early_exit import EarlyExitDraft

    return EarlyExitDraft(pipe, config)


class Speculator:
    """The speculative step of one scheduler."""

    def __init__(self, pipe, config: dict):
        self.pipe, self.k_max = pipe, config["k"]
        self.verifier = verifier_for(pipe)
        self.draft = make_draft(pipe, config)
        self.draft.verifier = self.verifier  # an early-exit draft reads the full model's cache of its layers
        self.totals = Counts()

    def step(self, scheduler) -> list[tuple[Sequence, Delta]] | None:
        active = list(scheduler.active)
        drafts = []
        for row, seq in enumerate(active):  # a draft's time counts as the sequence's decoding time
            t0 = time.perf_counter()
            drafts.append(self._propose(seq, row))
            seq.decode_s += time.perf_counter() - t0
        if not any(tokens for tokens, _ in drafts):
            return None  # the plain batched step
        if self.verifier.batches:
            t0 = time.perf_counter()
            events = self._verify_all(scheduler, active, drafts)
            spent = time.perf_counter() - t0
            for seq in active:  # one call for all, as a plain step's time counts for each sequence
                seq.decode_s += spent
        else:
            events = []
            for row, (seq, (tokens, q)) in enumerate(zip(active, drafts)):
                t0 = time.perf_counter()
                events += self._verify(scheduler, seq, row, tokens, q)
                seq.decode_s += time.perf_counter() - t0
        for seq, delta in events:
            if delta.finish_reason:
                scheduler.release(seq)
        return events

    def _propose(self, seq: Sequence, row: int):
        if seq.speculative is None:
            seq.speculative = Counts()
        count = min(next_k(seq.speculative, self.k_max), room(seq))
        return self.draft.propose(seq, count, row) if count > 0 else ([], None)

    def _verify(self, scheduler, seq: Sequence, row: int, tokens: list[int], q) -> list[tuple[Sequence, Delta]]:
        """One sequence's verification call: its events and its cache cut back to what was kept."""
        start = self.verifier.length(seq, row)
        logits = self.verifier.verify(seq, row, self.pipe.embed(np.array([[seq.tokens[-1], *tokens]], np.int64)))
        return self._accept(scheduler, seq, row, tokens, q, logits, start)

    def _verify_all(self, scheduler, active: list[Sequence], drafts: list) -> list[tuple[Sequence, Delta]]:
        """Every running sequence's last token and draft in one call, padded to the longest (the padding's logits
        are not read and its cache positions are cut back like rejected ones'). The width stays within every
        sequence's worst case (prompt + its token limit), which its KV place holds."""
        width = 1 + min(max(len(tokens) for tokens, _ in drafts), *(room(seq) + 1 for seq in active))
        drafts = [(tokens[:width - 1], None if q is None else q[:width - 1]) for tokens, q in drafts]
        starts = [self.verifier.length(seq, row) for row, seq in enumerate(active)]
        ids = [[seq.tokens[-1], *tokens] + [seq.tokens[-1]] * (width - 1 - len(tokens))
               for seq, (tokens, _) in zip(active, drafts)]
        logits = self.verifier.verify_all(active, self.pipe.embed(np.array(ids, np.int64)))
        events = []
        for row, (seq, (tokens, q)) in enumerate(zip(active, drafts)):
            events += self._accept(scheduler, seq, row, tokens, q, logits[row, :len(tokens) + 1], starts[row])
        return events

    def _accept(self, scheduler, seq: Sequence, row: int, tokens: list[int], q, logits: np.ndarray,
                start: int) -> list[tuple[Sequence, Delta]]:
        """The kept tokens' events from the verification's logits (one row per drafted token and one after), and
        the sequence's cache cut back to them from its length `start` before the call."""
        events, kept = [], 0
        for i, row_logits in enumerate(logits):
            drafted = tokens[i] if i < len(tokens) else None
            accepted = self._choose(seq, row_logits, drafted, None if q is None or drafted is None else q[i])
            delta = scheduler.emit(seq)
            events.append((seq, delta))
            kept += accepted
            if not accepted or delta.finish_reason:
                break
        seq.speculative.add(len(tokens), kept)
        self.totals.add(len(tokens), kept)
        self.verifier.rollback(seq, row, start + 1 + kept)
        self.draft.commit(seq, kept)
        return events

    @staticmethod
    def _choose(seq: Sequence, logits: np.ndarray, drafted: int | None, q: np.ndarray | None) -> bool:
        """Append the target's token at this position; whether it is the drafted one (always False past the
        draft)."""
        if drafted is None or seq.prep.sampling.temperature == 0:
            seq.choose(logits)
            return seq.tokens[-1] == drafted
        if seq.sampler is None:
            seq.sampler = Sampler(seq.prep.sampling, seq.prep.ids, len(logits))
        token, kept, margin = verify_sampled(seq.sampler, logits, drafted, q)
        seq.tokens.append(token)
        seq.margins.append(margin)
        return kept
