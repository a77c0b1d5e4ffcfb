"""The early-exit draft: the bundle's `draft` component (the LLM's first K decoder layers, its final norm and
lm_head) proposes tokens one call each.

Its K layers are the full model's own, so their keys and values at every verified position are the full model's
cache of layers 0..K-1: each step starts from that (speculative_kv.py reads it out of any layout) and only the
drafted tokens' keys and values are the draft's own, dropped after the step. Nothing is rolled back.
Greedy requests draft the argmax; sampled ones draw from the draft's distribution under the request's sampling
parameters, which speculative sampling then needs as q.
"""

from __future__ import annotations

import numpy as np

from mmtrt.errors import UserError
from mmtrt.runtime.batch import Sequence
from mmtrt.runtime.executors import component_runner
from mmtrt.runtime.sampling import Sampler, penalize
from mmtrt.runtime.speculative_sampling import probabilities


class EarlyExitDraft:
    name = "early_exit"

    def __init__(self, pipe, config: dict):
        self.pipe, self.component = pipe, config.get("component", "draft")
        if self.component not in pipe.specs:
            raise UserError(f"{pipe.path} has no early-exit draft (component {self.component!r}); compile it with "
                            "`speculative: {draft: early_exit, layers: K}` or use draft prompt_lookup")
        if self.component not in pipe.runners:
            pipe.runners[self.component] = component_runner(pipe.path, pipe.manifest, self.component, pipe.choices,
                                                           None, True)
        specs = {s.name: s for s in pipe.specs[self.component]}
        self.layers = sum(name.startswith("past.") and name.endswith(".key") for name in specs)
        self.position_rows = len(specs["position_ids"].shape) - 1
        self.cache_dtype = np.float16 if specs["past.0.key"].dtype == "float16" else np.float32
        self.verifier = None  # set by the Speculator: where the full model's cache is read from

    def propose(self, seq: Sequence, count: int, row: int) -> tuple[list[int], list[np.ndarray] | None]:
        past = {name: np.ascontiguousarray(a, self.cache_dtype)
                for name, a in self.verifier.lower_cache(seq, row, self.layers).items()}
        length = next(iter(past.values())).shape[2]
        token, tokens, qs = seq.tokens[-1], [], []
        for i in range(count):
            logits, past = self._step(token, past, length + i + seq.prep.rope_delta)
            token, q = self._draft_token(seq, logits)
            tokens.append(token)
            qs.append(q)
        return tokens, (None if seq.prep.sampling.temperature == 0 else qs)

    def commit(self, seq: Sequence, kept: int) -> None:
        """Nothing to roll back: the next step reads the full model's cache again."""

    def _step(self, token: int, past: dict[str, np.ndarray], position: int):
        embeds = self.pipe.embed(np.array([[token]], np.int64))
        positions = np.full((3, 1, 1) if self.position_rows == 2 else (1, 1), position, np.int64)
        total = next(iter(past.values())).shape[2] + 1
        out = self.pipe._run(self.component, {"inputs_embeds": embeds, "attention_mask": np.ones((1, total), np.int64),
                                              "position_ids": positions, **past})
        return out["logits"][0, -1], {k.replace("present.", "past."): v for k, v in out.items()
                                      if k.startswith("present.")}

    @staticmethod
    def _draft_token(seq: Sequence, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        params = seq.prep.sampling
        if params.temperature == 0:
            return int(np.argmax(logits)), None
        if seq.sampler is None:
            seq.sampler = Sampler(params, seq.prep.ids, len(logits))
        x = penalize(logits.astype(np.float64), seq.sampler.seen, params.repetition_penalty)
        q = probabilities(x, params.temperature, params.top_k, params.top_p)
        return int(seq.sampler.rng.choice(len(q), p=q)), q
