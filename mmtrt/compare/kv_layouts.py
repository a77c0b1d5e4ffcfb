"""The LLM of a bundle whose cache kv_layout rewrote (static buffers or a paged pool), compared on what its cache
holds: the feeds fill every buffer with random values, the sequence's own rows among them; the PyTorch side reads
the sequence's rows as the hf layout's past (`hf_feed`), and each side's presents are cut to the sequence's rows
after the call (`valid_presents`), so the rows a sequence does not own must be neither read nor written.

A static buffer holds a sequence at rows 0..length-1, told by `seqlens_k` (length after the call, minus 1). A
paged pool holds it in the blocks of its table, in table order; the feeds give it blocks of the pool in a random
order, so a gather that ignored the table reads another sequence's rows."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mmtrt.errors import UserError

SEQLENS, TOTAL, SLOTS, TABLE, CACHE_POSITIONS = ("seqlens_k", "total_sequence_length", "slot_mapping", "block_table",
                                                 "cache_positions")


def layout(manifest: dict[str, Any]) -> dict[str, Any] | None:
    return manifest["model"].get("kv_cache")


def rewritten(manifest: dict[str, Any], component: str) -> bool:
    """Whether `component` is an LLM whose cache kv_layout rewrote."""
    return component == "llm" and layout(manifest) is not None


def sizes(manifest: dict[str, Any], base: dict[str, int]) -> dict[str, int]:
    """The iteration's sizes with the layout's own dimensions: the buffers' capacity, the pool's slots, the blocks
    a sequence of `total` tokens takes and the tokens written in the call."""
    dims, kv = manifest["dims"], layout(manifest)
    extra = {name: dims[name]["max"] for name in ("capacity", "num_slots") if name in dims}
    if kv["layout"] == "paged":
        extra.update(max_blocks=math.ceil(base["total"] / kv["block_tokens"]), new_tokens=base["batch"] * base["seq"])
    return {**base, **extra}


def fill(manifest: dict[str, Any], sizes: dict[str, int], feed: dict[str, np.ndarray],
         rng: np.random.Generator) -> None:
    """Overwrite the layout's index inputs of `feed` (its buffers keep their random values): lengths for static
    buffers; for a pool, a table of distinct blocks drawn at random and the slots of the new tokens in them."""
    batch, seq, past = sizes["batch"], sizes["seq"], sizes["past"]
    if SEQLENS in feed:
        feed[SEQLENS] = np.full(batch, past + seq - 1, np.int32)
        feed[TOTAL] = np.array(past + seq, np.int32)
        return
    block = layout(manifest)["block_tokens"]
    pool = sizes["num_slots"] // block
    table = rng.permutation(pool)[:batch * sizes["max_blocks"]].reshape(batch, -1).astype(np.int64)
    positions = np.arange(past, past + seq)
    feed[TABLE] = table
    feed[SLOTS] = _slots(table, positions, block).reshape(-1, 1)
    if CACHE_POSITIONS in feed:
        feed[CACHE_POSITIONS] = np.broadcast_to(positions, (batch, seq)).astype(np.int64)


def _lengths(manifest: dict[str, Any], feed: dict[str, np.ndarray]) -> tuple[int, int]:
    """(past, seq) of the call: every sequence in a compared batch holds as many tokens."""
    seq = feed["inputs_embeds"].shape[1]
    if SEQLENS in feed:
        totals = feed[SEQLENS].astype(np.int64) + 1
    else:
        starts = feed[CACHE_POSITIONS] if CACHE_POSITIONS in feed else feed["position_ids"]
        totals = starts[..., 0].reshape(-1) + seq
    if len(set(totals.tolist())) != 1:
        raise UserError(f"compare runs the {layout(manifest)['layout']} cache's sequences of one length per call, and "
                        f"these inputs hold {sorted(set(totals.tolist()))} tokens; save inputs of equal lengths")
    return int(totals[0]) - seq, seq


def _rows(manifest: dict[str, Any], feed: dict[str, np.ndarray], buffer: np.ndarray, tokens: int) -> np.ndarray:
    """The sequence's first `tokens` rows of a cache buffer, as the hf layout's `[batch, H_kv, tokens, D]`."""
    if SEQLENS in feed:
        return np.ascontiguousarray(buffer[:, :, :tokens])
    slots = _slots(feed[TABLE], np.arange(tokens), layout(manifest)["block_tokens"])
    return np.ascontiguousarray(buffer[slots].transpose(0, 2, 1, 3))


def _slots(table: np.ndarray, positions: np.ndarray, block: int) -> np.ndarray:
    """The pool slots [batch, len(positions)] of each sequence's tokens at `positions`, through its block table."""
    return table[:, positions // block] * block + positions % block


def hf_feed(manifest: dict[str, Any], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The hf layout's inputs for the same call: the sequence's past rows, an all-ones mask over past + seq."""
    past, seq = _lengths(manifest, feed)
    batch = feed["inputs_embeds"].shape[0]
    out = {"inputs_embeds": feed["inputs_embeds"], "position_ids": feed["position_ids"],
           "attention_mask": np.ones((batch, past + seq), np.int64)}
    out.update({name: _rows(manifest, feed, value, past) for name, value in feed.items() if name.startswith("past.")})
    return out


def valid_presents(manifest: dict[str, Any], feed: dict[str, np.ndarray], outputs: dict) -> dict:
    """The outputs with each present cut to the sequence's rows after the call."""
    past, seq = _lengths(manifest, feed)
    return type(outputs)((name, _rows(manifest, feed, value, past + seq) if name.startswith("present.") else value)
                         for name, value in outputs.items())
