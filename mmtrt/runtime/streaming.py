"""Text as tokens come: an incremental detokenizer that never splits a character, and stop strings.

A token's text is the decode of a short window (the tokens since the last clean cut) minus the decode of the
window without it, as vLLM's incremental detokenizer does: a byte-level token may end inside a multi-byte
character (the decode then ends in U+FFFD) and is held until the character completes, and a token's leading space
survives because the window starts before it. The deltas add up to the decode of all tokens at once.

Stop strings end the text before their first occurrence, also when one spans several tokens. Text that could be
the start of a stop string is held back until the next token rules that out (or the sequence ends).
"""

from __future__ import annotations

from dataclasses import dataclass, field

REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class Delta:
    """What one decode step adds to a request's output. `finish_reason` is None until the last delta, then
    "stop" (an end-of-sequence token or a stop string), "length" (max_new_tokens), "abort" (cancelled) or
    "error" (`error` says why; nothing more follows)."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None = None
    error: str | None = field(default=None, compare=False)


class TextStream:
    """The visible text of one sequence, token by token: `push` returns what a token adds, `flush` the rest."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, tuple(stop)
        self.tokens: list[int] = []
        self.window_start = self.window_clean = 0  # tokens[start:clean] decode without a split character
        self.text = ""  # decoded so far (stop strings cut)
        self.sent = 0  # characters of text already returned
        self.stopped = False  # a stop string was found: text ends before it and nothing more is added

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self.tokens.append(token)
        before = self._decode(self.tokens[self.window_start:self.window_clean])
        after = self._decode(self.tokens[self.window_start:])
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""
        old = len(self.text)
        self.text += after[len(before):]
        self.window_start, self.window_clean = self.window_clean, len(self.tokens)
        self._cut_at_stop(old)
        return self._release(len(self.text) if self.stopped else len(self.text) - self._held())

    def flush(self) -> str:
        """At the end of the sequence: the text held back (a possible stop's start, a split character, which
        shows as U+FFFD as in a whole decode)."""
        if not self.stopped and self.window_clean < len(self.tokens):
            tail = self._decode(self.tokens[self.window_start:])[
                len(self._decode(self.tokens[self.window_start:self.window_clean])):]
            old = len(self.text)
            self.text += tail
            self._cut_at_stop(old)
        return self._release(len(self.text))

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""

    def _cut_at_stop(self, old: int) -> None:
        """Cut the text at the first stop string that the new text completes (it may start before `old`)."""
        if not self.stop:
            return
        start = max(0, old - max(len(s) for s in self.stop) + 1)
        found = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if found:
            self.text, self.stopped = self.text[:min(found)], True

    def _held(self) -> int:
        """How many trailing characters may begin a stop string."""
        longest = max((len(s) for s in self.stop), default=1) - 1
        for n in range(min(longest, len(self.text)), 0, -1):
            if any(s.startswith(self.text[-n:]) for s in self.stop):
                return n
        return 0

    def _release(self, upto: int) -> str:
        upto = max(upto, self.sent)
        out, self.sent = self.text[self.sent:upto], upto
        return out
