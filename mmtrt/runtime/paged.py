"""The paged KV cache: one pool of blocks per layer and kind, a block table per sequence, continuous batching.

The pools `[num_slots, H_kv, D]` are allocated once per load and bound as both past and present (IOBinding), so
the graph writes each new token at its slot in place. Blocks are taken as a sequence grows. A request is admitted
when a batch place is free and the pool can hold its worst case (prompt + max new tokens) on top of what the
running ones may still take, so a running sequence never finds the pool empty; the others wait for blocks.

Running requests that share an image prefix (the template text before the image, then the image tokens of the
same pixels) share its blocks: a later one forks a live holder's table (full blocks counted, the partly filled
last one copied) and prefills only what follows the image (`scheduler.Blocks` tracks the holders).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort

from mmtrt.errors import UserError
from mmtrt.runtime.batch import Prepared, position_rows, step_positions
from mmtrt.runtime.blocks import BlockAllocator
from mmtrt.runtime.kv import cache_dtype
from mmtrt.runtime.prefix import keep_prefixes


class PagedCache:
    def __init__(self, kv: dict[str, Any], llm: dict[str, Any], dims: dict[str, Any]):
        self.block_tokens = kv["block_tokens"]
        self.dtype = cache_dtype(kv)
        self.shape = (dims["num_slots"]["max"], llm["num_kv_heads"], llm["head_dim"])
        self.names = [(kv["past"].format(layer=i, kind=k), kv["present"].format(layer=i, kind=k))
                      for i in range(llm["num_layers"]) for k in kv["kinds"]]
        self.host = {past: np.zeros(self.shape, self.dtype) for past, _ in self.names}
        self.allocator = BlockAllocator(dims["pool_blocks"]["max"])
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self.deltas: dict[int, int] = {}  # each sequence's M-RoPE rope delta (0 otherwise)
        self.promised: dict[int, int] = {}  # blocks each live sequence may still take, at most

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def can_open(self, worst_tokens: int, shared_tokens: int = 0) -> bool:
        """Whether a sequence of at most `worst_tokens` fits, its first `shared_tokens` forked from another."""
        need = self.blocks_for(worst_tokens) - shared_tokens // self.block_tokens
        return need <= self.allocator.available - sum(self.promised.values())

    def open(self, seq: int, worst_tokens: int) -> None:
        self.tables[seq], self.lengths[seq], self.deltas[seq] = [], 0, 0
        self.promised[seq] = self.blocks_for(worst_tokens)

    def grow(self, seq: int, tokens: int) -> None:
        """Blocks for `tokens` positions of `seq`, taken from what was promised to it."""
        missing = self.blocks_for(tokens) - len(self.tables[seq])
        if missing > 0:
            self.tables[seq] += self.allocator.allocate(missing)
            self.promised[seq] = max(self.promised[seq] - missing, 0)

    def fork(self, src: int, dst: int, tokens: int) -> None:
        """dst starts with src's first `tokens` positions: full blocks shared (counted), a partial last block copied
        into a block of dst's own (copy on write), since dst will write the rest of it. dst was just opened."""
        full, rest = divmod(tokens, self.block_tokens)
        shared = self.tables[src][:full]
        for block in shared:
            self.allocator.share(block)
        self.tables[dst] = list(shared)
        self.promised[dst] = max(self.promised[dst] - full, 0)
        if rest:
            self.grow(dst, tokens)
            old, new = self.tables[src][full] * self.block_tokens, self.tables[dst][full] * self.block_tokens
            for pool in self.host.values():
                pool[new:new + rest] = pool[old:old + rest]
        self.lengths[dst] = tokens

    def truncate(self, seq: int, tokens: int) -> None:
        """`seq` keeps its first `tokens` positions (a rejected draft's go): the blocks past them return to the
        pool and to what the sequence was promised."""
        keep = self.blocks_for(tokens)
        for block in self.tables[seq][keep:]:
            self.allocator.release(block)
        self.promised[seq] += len(self.tables[seq]) - keep
        del self.tables[seq][keep:]
        self.lengths[seq] = tokens

    def close(self, seq: int) -> None:
        for block in self.tables.pop(seq):
            self.allocator.release(block)
        del self.lengths[seq], self.deltas[seq], self.promised[seq]

    def slots(self, seq: int, start: int, count: int) -> list[int]:
        table, bt = self.tables[seq], self.block_tokens
        return [table[p // bt] * bt + p % bt for p in range(start, start + count)]

    def bind(self, io: ort.IOBinding) -> None:
        for past, present in self.names:
            ptr = self.host[past].ctypes.data
            io.bind_input(past, "cpu", 0, self.dtype, self.shape, ptr)
            io.bind_output(present, "cpu", 0, self.dtype, self.shape, ptr)


class PagedStepper:
    def __init__(self, session, cache: PagedCache, batch_max: int):
        self.session, self.cache, self.batch_max = session, cache, batch_max
        self.rows = position_rows(session)
        self.cache_positions = any(i.name == "cache_positions" for i in session.get_inputs())
        self.embed_dtype = np.float16 if session.get_inputs()[0].type == "tensor(float16)" else np.float32

    def reset(self, batch: int) -> None:
        """Sequences -1..-batch (outside request indices) restart empty, for `Pipeline.step` callers."""
        for seq in range(-1, -batch - 1, -1):
            if seq in self.cache.tables:
                self.cache.close(seq)
            self.cache.open(seq, 0)
        self.direct = list(range(-1, -batch - 1, -1))

    def clear(self, seq: int) -> None:
        """A sequence is opened empty."""

    def prefill(self, seq: int, embeds: np.ndarray, positions: np.ndarray | None = None,
                delta: int = 0) -> np.ndarray:
        """As StaticStepper.prefill: the prompt's M-RoPE `positions` and the rope delta of its decode steps."""
        self.cache.deltas[seq] = delta
        return self.run(embeds, [seq], last_only=True, positions=positions)

    def load_prefix(self, seq: int, arrays: list[np.ndarray]) -> None:
        tokens = arrays[0].shape[0]
        self.cache.grow(seq, tokens)
        slots = self.cache.slots(seq, 0, tokens)
        for (past, _), rows in zip(self.cache.names, arrays):
            self.cache.host[past][slots] = rows
        self.cache.lengths[seq] = tokens

    def save_prefix(self, seq: int, tokens: int) -> list[np.ndarray]:
        slots = self.cache.slots(seq, 0, tokens)
        return [self.cache.host[past][slots] for past, _ in self.cache.names]

    def run_all(self, embeds: np.ndarray, positions: np.ndarray | None = None, delta: int = 0,
                last_only: bool = False) -> np.ndarray:
        seqs = self.direct[:embeds.shape[0]]
        self.cache.deltas.update(dict.fromkeys(seqs, delta))
        return self.run(embeds, seqs, last_only=last_only, positions=positions)

    def run(self, embeds: np.ndarray, seqs: list[int], last_only: bool,
            positions: np.ndarray | None = None) -> np.ndarray:
        cache, seq_len = self.cache, embeds.shape[1]
        lengths = np.array([cache.lengths[s] for s in seqs], np.int64)
        if positions is None:
            positions = step_positions(lengths, np.array([cache.deltas[s] for s in seqs], np.int64), seq_len,
                                       self.rows)
        for s, n in zip(seqs, lengths):
            cache.grow(s, int(n) + seq_len)
        width = max(len(cache.tables[s]) for s in seqs)
        table = np.array([cache.tables[s] + [0] * (width - len(cache.tables[s])) for s in seqs], np.int64)
        slots = [slot for s, n in zip(seqs, lengths) for slot in cache.slots(s, int(n), seq_len)]
        io = self.session.io_binding()
        io.bind_cpu_input("inputs_embeds", np.ascontiguousarray(embeds, self.embed_dtype))
        io.bind_cpu_input("position_ids", np.ascontiguousarray(positions, np.int64))
        if self.cache_positions:  # M-RoPE: where each new token sits in its sequence, for the causal mask
            io.bind_cpu_input("cache_positions", lengths[:, None] + np.arange(seq_len, dtype=np.int64))
        io.bind_cpu_input("slot_mapping", np.array(slots, np.int64)[:, None])
        io.bind_cpu_input("block_table", table)
        io.bind_cpu_input("logits_from", np.array([seq_len - 1 if last_only else 0], np.int64))
        io.bind_output("logits")
        cache.bind(io)
        self.session.run_with_iobinding(io)
        for s in seqs:
            cache.lengths[s] += seq_len
        return io.get_outputs()[0].numpy().astype(np.float32, copy=False)

    def check(self, prep: Prepared) -> None:
        need = self.cache.blocks_for(len(prep.ids) + prep.limit)
        if need > self.cache.allocator.total:
            raise UserError(f"the request needs {need} KV blocks, the bundle's pool holds "
                            f"{self.cache.allocator.total}; recompile with a larger kv_layout.pool_blocks")


def prefill_sharing(pipe, stepper: PagedStepper, holders: dict[str, list[int]], prep: Prepared) -> np.ndarray:
    """Prefill an opened sequence: forked from a live holder of its image prefix when there is one (only the text
    after the image runs), else as `Pipeline.prefill` does. It then holds the prefix for the requests after it."""
    if not prep.prefix_key:
        return pipe.prefill(stepper, prep.index, prep)
    owners = holders.setdefault(prep.prefix_key, [])
    if owners:
        stepper.cache.fork(owners[0], prep.index, prep.prefix_len)
        logits = stepper.prefill(prep.index, prep.after_prefix(), prep.positions_after_prefix(), prep.rope_delta)
        keep_prefixes(pipe, stepper, prep.index, prep, fresh=False)
    else:
        logits = pipe.prefill(stepper, prep.index, prep)
    owners.append(prep.index)
    return logits
