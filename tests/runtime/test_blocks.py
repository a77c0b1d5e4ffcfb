"""The paged cache's block bookkeeping under random admit / grow / fork / finish sequences (hypothesis): blocks
are shared only through a counted forked prefix, a fork's partial block is copied (a later write to either side
leaves the other's KV), every admitted sequence can grow to its worst case, and every block returns at the end."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmtrt.runtime.blocks import BlockAllocator, PoolExhausted
from mmtrt.runtime.paged import PagedCache

BLOCK, BLOCKS = 4, 12
KV = {"block_tokens": BLOCK, "dtype": "float32", "past": "past.{layer}.{kind}", "present": "present.{layer}.{kind}",
      "kinds": ["key", "value"]}
LLM = {"num_kv_heads": 1, "head_dim": 1, "num_layers": 1}
DIMS = {"num_slots": {"max": BLOCK * BLOCKS}, "pool_blocks": {"max": BLOCKS}}

ops = st.lists(st.tuples(st.sampled_from(["open", "grow", "fork", "close"]), st.integers(0, 3), st.integers(1, 20)),
               min_size=20, max_size=80)


class Model:
    """The cache plus what every live sequence wrote at each of its positions (its id, or its source's)."""

    def __init__(self):
        self.cache = PagedCache(KV, LLM, DIMS)
        self.pool = self.cache.host["past.0.key"][:, 0, 0]
        self.written: dict[int, list[float]] = {}
        self.forked: dict[int, int] = {}  # full blocks at the start of each table that a fork shares (counted)

    def fork(self, src: int, dst: int, tokens: int) -> None:
        self.cache.fork(src, dst, tokens)
        full = tokens // BLOCK
        self.forked[dst], self.forked[src] = full, max(self.forked.get(src, 0), full)

    def write(self, seq: int, tokens: int) -> None:
        start = self.cache.lengths[seq]
        self.cache.grow(seq, tokens)
        self.pool[self.cache.slots(seq, start, tokens - start)] = seq
        self.written[seq] += [float(seq)] * (tokens - start)
        self.cache.lengths[seq] = tokens

    def check(self) -> None:
        cache, alloc = self.cache, self.cache.allocator
        owners = np.zeros(BLOCKS, int)
        for table in cache.tables.values():
            assert len(set(table)) == len(table)
            owners[table] += 1
        assert list(owners) == alloc.refs, "a block is owned by more sequences than its count says"
        for block in np.flatnonzero(owners > 1):
            places = {seq: table.index(block) for seq, table in cache.tables.items() if block in table}
            assert len(set(places.values())) == 1, f"block {block} is shared at different positions"
            assert all(p < self.forked.get(seq, 0) for seq, p in places.items()), \
                f"block {block} is shared outside a forked prefix"
        assert set(alloc.free) == {b for b in range(BLOCKS) if owners[b] == 0}
        assert len(set(alloc.free)) == len(alloc.free)
        for seq, values in self.written.items():
            assert list(self.pool[cache.slots(seq, 0, len(values))]) == values, f"sequence {seq}'s KV was overwritten"
        assert sum(cache.promised.values()) <= alloc.available


@settings(max_examples=150, deadline=None)
@given(ops)
def test_no_block_is_shared_uncounted_nothing_is_overwritten_and_all_return(sequence):
    m, worst = Model(), {}
    for op, seq, size in sequence:
        live = seq in m.cache.tables
        if op == "open" and not live and m.cache.can_open(size):
            m.cache.open(seq, size)
            worst[seq], m.written[seq] = size, []
        elif op == "grow" and live and m.cache.lengths[seq] < worst[seq]:
            m.write(seq, min(worst[seq], m.cache.lengths[seq] + size))
        elif op == "fork" and live and m.cache.lengths[seq] and len(m.cache.tables) < 4:
            dst = next(d for d in range(4) if d not in m.cache.tables)
            tokens = 1 + size % m.cache.lengths[seq]
            if m.cache.can_open(tokens + size, tokens):
                m.cache.open(dst, tokens + size)
                m.fork(seq, dst, tokens)
                worst[dst], m.written[dst] = tokens + size, m.written[seq][:tokens]
        elif op == "close" and live:
            m.cache.close(seq)
            del m.written[seq], worst[seq]
            m.forked.pop(seq, None)
        m.check()
    for seq in list(m.cache.tables):
        m.cache.close(seq)
    assert m.cache.allocator.available == BLOCKS and not any(m.cache.allocator.refs)


@given(st.integers(1, BLOCKS), st.integers(1, BLOCKS))
def test_exhaustion_raises_before_anything_changes(first, second):
    alloc = BlockAllocator(BLOCKS)
    taken = alloc.allocate(first)
    free_before = list(alloc.free)
    if first + second > BLOCKS:
        with pytest.raises(PoolExhausted):
            alloc.allocate(second)
        assert alloc.free == free_before and sum(alloc.refs) == first
    else:
        assert not set(alloc.allocate(second)) & set(taken)


def test_a_free_block_can_be_neither_shared_nor_released():
    alloc = BlockAllocator(2)
    with pytest.raises(ValueError):
        alloc.share(0)
    with pytest.raises(ValueError):
        alloc.release(1)


def test_a_bfloat16_cache_is_refused_in_one_line():
    from mmtrt.errors import UserError

    with pytest.raises(UserError, match="KV cache is bfloat16; the runtime holds float32 and float16 caches"):
        PagedCache({**KV, "dtype": "bfloat16"}, LLM, DIMS)
