"""Drafts that propose the next tokens for the full LLM to verify.

`prompt_lookup` needs no model: the last n tokens of the text so far (prompt and answer) are looked up in it, longest
n first, and the tokens that followed an earlier occurrence are proposed (`lookup`). Answers that quote the prompt,
repeat a phrase or continue a list accept long runs; elsewhere nothing is proposed and the step is a plain one.
"""

from __future__ import annotations

from mmtrt.runtime.batch import Sequence


class PromptLookup:
    """Proposals are point masses (no distribution): speculative sampling keeps a token with probability p."""

    name = "prompt_lookup"

    def __init__(self, max_ngram: int, skip_token: int | None = None):
        self.max_ngram, self.skip_token = max_ngram, skip_token

    def propose(self, seq: Sequence, count: int, _row: int) -> tuple[list[int], None]:
        return lookup(seq.prep.ids + seq.tokens, count, self.max_ngram, self.skip_token), None

    def commit(self, seq: Sequence, kept: int) -> None:
        """Nothing to roll back: the lookup keeps no state."""


def lookup(context: list[int], count: int, max_ngram: int, skip_token: int | None = None) -> list[int]:
    """Up to `count` tokens that followed an earlier occurrence of the context's last n tokens (n from `max_ngram`
    down to 1): the latest occurrence with `count` tokens after it, else the one with the most (in a run that
    repeats, the latest occurrence is the run's own last step, with one token after it; vLLM's n-gram proposer
    takes the earliest); cut before `skip_token` (the image placeholder, whose embeddings are not a token's).
    A plain scan (a few hundred comparisons): numpy's per-call overhead costs more than the scan at this size."""
    last = context[-1]
    ends = [j for j in range(len(context) - 2, -1, -1) if context[j] == last]  # latest first
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        suffix, best = context[-n:], []
        for end in ends:
            if end >= n - 1 and context[end - n + 1:end + 1] == suffix:
                proposal = context[end + 1:end + 1 + count]
                if skip_token in proposal:
                    proposal = proposal[:proposal.index(skip_token)]
                if len(proposal) > len(best):
                    best = proposal
                if len(best) == count:
                    break
        if best:
            return best
    return []
