"""The serving loop's scheduler when vLLM runs the LLM: requests are handed to the vLLM worker, which batches them
continuously itself, and the tokens it sends back become the loop's deltas.

It has runtime.scheduler.Scheduler's interface (fits, admit, step, release, close, usage, active, max_batch), so
mmtrt's ServingLoop, and through it both front doors, drive it unchanged. mmtrt keeps the text side: the
incremental detokenizer and stop strings (a stop string found cancels the request in vLLM).
"""

from __future__ import annotations

import queue
import time
from typing import Iterator

from mmtrt.runtime.batch import Prepared, Sequence
from mmtrt.runtime.streaming import Delta, TextStream


def collapse_image_runs(ids: list[int], image_token_id: int) -> list[int]:
    """The prompt with each image's run of image tokens as one placeholder token: vLLM expands a placeholder to
    the count of the image embeddings it is given, so an expanded run would be expanded again."""
    return [t for i, t in enumerate(ids) if t != image_token_id or i == 0 or ids[i - 1] != image_token_id]


class VllmScheduler:
    def __init__(self, pipe, max_batch: int, owns_pipeline: bool = False):
        self.pipe, self.max_batch, self.owns_pipeline = pipe, max_batch, owns_pipeline
        self.active: list[Sequence] = []
        self.by_id: dict[str, Sequence] = {}
        self.messages: queue.SimpleQueue = queue.SimpleQueue()
        self.started: dict[str, float] = {}
        self.rids: dict[Sequence, str] = {}

    def fits(self, prep: Prepared, joining: tuple[Prepared, ...] = ()) -> bool:
        return len(self.active) + len(joining) < self.max_batch

    def joins(self, prep: Prepared, joining: tuple[Prepared, ...]) -> bool:
        """Each request is handed over alone, as soon as its own image is encoded: vLLM prefills it while mmtrt
        encodes the next one (admitted together, every image would be encoded before vLLM got the first)."""
        return False

    def admit_together(self, preps: list[Prepared], between=None) -> list[tuple[Sequence, Delta]]:
        """vLLM's own scheduler interleaves prefills with decode steps; `between` (the loop's step) runs when vLLM
        has sent tokens already, so they reach their clients while the next images are encoded."""
        events = [self.admit(prep) for prep in preps]
        if between is not None and not self.messages.empty():
            between()
        return events

    def admit(self, prep: Prepared) -> tuple[Sequence, Delta]:
        """Hand the request to vLLM; its tokens come in later steps, so the delta it returns is empty."""
        seq = Sequence(prep)
        seq.text = TextStream(self.pipe.tokenizer, prep.sampling.stop)
        rid = self.pipe.engine.new_id()
        self.rids[seq], self.by_id[rid], self.started[rid] = rid, seq, time.perf_counter()
        s = prep.sampling
        sampling = {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "seed": s.seed,
                    "repetition_penalty": s.repetition_penalty}
        image_inputs = prep.embeds  # this pipeline's embed_request leaves the image's vLLM inputs there
        self.pipe.engine.submit(rid, collapse_image_runs(prep.ids, self.pipe.model["image_token_id"]),
                                image_inputs, sampling, prep.limit,
                                list(self.pipe.model["eos_token_ids"]), self.messages.put)
        self.active.append(seq)
        return seq, Delta((), "")

    def step(self, wait_s: float = 0.05) -> list[tuple[Sequence, Delta]]:
        """The deltas of every message vLLM has sent since the last step (waiting up to `wait_s` for one)."""
        if not self.active:
            return []
        events = []
        try:
            message = self.messages.get(timeout=wait_s)
            while True:
                event = self._advance(message)
                if event is not None:
                    events.append(event)
                message = self.messages.get_nowait()
        except queue.Empty:
            return events

    def _advance(self, message: dict) -> tuple[Sequence, Delta] | None:
        rid = message["id"]
        seq = self.by_id.get(rid)
        if seq is None:  # released already
            return None
        now = time.perf_counter()
        if "image_tokens" in message:
            seq.prep.timings["prefill_ms"] = 1e3 * (now - self.started[rid])
            seq.prep.timings["engine_prompt_tokens"] = message["prompt_tokens"]
            seq.prep.timings["engine_image_tokens"] = message["image_tokens"]
        elif seq.tokens:
            seq.decode_s += now - self.started[rid]
        self.started[rid] = now
        tokens = message.get("tokens", [])
        seq.tokens += tokens
        text = "".join(seq.text.push(t) for t in tokens)
        reason = message.get("finish_reason")
        if seq.text.stopped and reason is None:
            reason = "stop"
        if reason == "error":
            self._forget(seq)
            return seq, Delta(tuple(tokens), text, "error", message.get("error"))
        if reason:
            seq.finish_reason = reason
            text += seq.text.flush()
            self.release(seq)
        return seq, Delta(tuple(tokens), text, reason)

    def release(self, seq: Sequence) -> None:
        """Take a running sequence out; vLLM frees its KV blocks (cancelled unless it finished)."""
        if seq.finish_reason is None or seq.text.stopped:
            self.pipe.engine.cancel(self.rids[seq])
        self._forget(seq)

    def _forget(self, seq: Sequence) -> None:
        if seq in self.active:
            self.active.remove(seq)
        rid = self.rids.pop(seq, None)
        self.by_id.pop(rid, None)
        self.started.pop(rid, None)

    def close(self) -> None:
        for seq in list(self.active):
            self.release(seq)
        if self.owns_pipeline:
            self.pipe.close()

    def usage(self) -> tuple[int, int]:
        return len(self.active), self.max_batch


def run_to_end(scheduler: VllmScheduler, prepared: list[Prepared]) -> Iterator[tuple[Sequence, Delta]]:
    """Every prepared request through `scheduler`, admitted in order as places free up; each delta's event."""
    waiting = list(prepared)
    try:
        while waiting or scheduler.active:
            while waiting and scheduler.fits(waiting[0]):
                yield scheduler.admit(waiting.pop(0))
            yield from scheduler.step(wait_s=1.0)
    finally:
        for seq in list(scheduler.active):
            scheduler.release(seq)
