"""Several admissions' prefills in one LLM call, under the paged KV layout.

The paged graph takes `[batch, seq]` tokens with a block table per row and masks each query to the keys at or
before its own place in its sequence (`passes/kv/paged.py`), so rows of different lengths can share a call: each
row is padded on the left to the longest, its last real token then sits in the last column (the one `logits_from`
asks for), and a pad writes its key and value into a block no sequence holds (the next free one, which every later
owner writes before it reads) and is seen by no real token. Each admission first takes what it can reuse (a live
holder's image prefix forked, or a stored prefix loaded), so only the rest of its prompt runs in the shared call.

The static layout cannot do this: its GroupQueryAttention reads each row's past length as its total length minus
the call's one new-token count, so every row of a call adds the same number of tokens; the hf layout's grown
caches are one array per sequence. Both admit one request per call.
"""

from __future__ import annotations

import numpy as np

from mmtrt.runtime.batch import Prepared
from mmtrt.runtime.prefix import keep_prefixes, stored_prefix


def prefill_together(pipe, stepper, holders: dict[str, list[int]], preps: list[Prepared]) -> list[np.ndarray]:
    """Prefill opened sequences (distinct image prefixes among the fresh ones) in one call; each one's logits of
    its last position. Each then holds its image prefix for later requests, as `paged.prefill_sharing` leaves it."""
    cache = stepper.cache
    parts = [_resume(pipe, stepper, holders, prep) for prep in preps]
    seqs = [prep.index for prep in preps]
    counts = [embeds.shape[1] for embeds, _, _ in parts]
    for seq, count in zip(seqs, counts):
        cache.grow(seq, cache.lengths[seq] + count)
    if len(set(counts)) > 1 and not cache.allocator.free:  # no block for the pads: one call each
        logits = [stepper.run(embeds, [seq], True, positions)[0, -1] for seq, (embeds, positions, _) in
                  zip(seqs, parts)]
    else:
        logits = list(run_padded(stepper, seqs, [(e, p) for e, p, _ in parts])[:, -1])
    for prep, (_, _, fresh) in zip(preps, parts):
        keep_prefixes(pipe, stepper, prep.index, prep, fresh)
        if prep.prefix_key:
            holders.setdefault(prep.prefix_key, []).append(prep.index)
    return logits


def _resume(pipe, stepper, holders, prep: Prepared) -> tuple[np.ndarray, np.ndarray | None, bool]:
    """What is left to prefill of `prep` (embeddings, M-RoPE positions) once its reusable prefix is in place, and
    whether it reused none."""
    stepper.cache.deltas[prep.index] = prep.rope_delta
    key = prep.prefix_key
    if key and holders.get(key):
        stepper.cache.fork(holders[key][0], prep.index, prep.prefix_len)
        return prep.after_prefix(), prep.positions_after_prefix(), False
    arrays = stored_prefix(pipe, prep)
    if arrays is not None:
        stepper.load_prefix(prep.index, arrays)
        return prep.after_prefix(), prep.positions_after_prefix(), False
    return prep.embeds, prep.positions, True


def run_padded(stepper, seqs: list[int], parts: list[tuple[np.ndarray, np.ndarray | None]]) -> np.ndarray:
    """One call over sequences that each add their own number of tokens (left-padded to the longest); the logits
    of the last column [len(seqs), 1, vocab]. The sequences' blocks for the new tokens are taken already."""
    cache, width = stepper.cache, max(embeds.shape[1] for embeds, _ in parts)
    embeds = np.zeros((len(seqs), width, parts[0][0].shape[-1]), stepper.embed_dtype)
    places = np.zeros((len(seqs), width), np.int64)  # each token's index in its sequence (a pad: the first one's)
    rotary = np.zeros((3, len(seqs), width), np.int64)  # M-RoPE's rows; the others take places + rope delta
    slots = np.full((len(seqs), width), cache.allocator.free[-1] * cache.block_tokens if cache.allocator.free else 0)
    for row, (seq, (new, positions)) in enumerate(zip(seqs, parts)):
        count, start, pad = new.shape[1], cache.lengths[seq], width - new.shape[1]
        embeds[row, pad:] = new[0]
        places[row] = start + np.maximum(np.arange(width) - pad, 0)
        given = (places[row] + cache.deltas[seq])[None] if positions is None else positions[:, 0]
        rotary[:, row, pad:] = given[..., -count:]
        rotary[:, row, :pad] = given[..., :1]
        slots[row, pad:] = cache.slots(seq, start, count)
    tables = [cache.tables[s] for s in seqs]
    table = np.array([t + [0] * (max(map(len, tables)) - len(t)) for t in tables], np.int64)
    io = stepper.session.io_binding()
    io.bind_cpu_input("inputs_embeds", embeds)
    io.bind_cpu_input("position_ids", np.ascontiguousarray(rotary if stepper.rows == 3 else rotary[0]))
    if stepper.cache_positions:
        io.bind_cpu_input("cache_positions", places)
    io.bind_cpu_input("slot_mapping", slots.reshape(-1, 1))
    io.bind_cpu_input("block_table", table)
    io.bind_cpu_input("logits_from", np.array([width - 1], np.int64))
    io.bind_output("logits")
    cache.bind(io)
    stepper.session.run_with_iobinding(io)
    for seq, (new, _) in zip(seqs, parts):
        cache.lengths[seq] += new.shape[1]
    return io.get_outputs()[0].numpy().astype(np.float32, copy=False)
