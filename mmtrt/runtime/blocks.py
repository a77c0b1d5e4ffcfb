"""The block allocator of the paged KV cache: a free list and a reference count per block.

A block is owned by every live sequence whose table lists it; a count above one means a shared prefix (an image's
KV computed once). A block returns to the free list when its last owner lets go. Running out raises
`PoolExhausted` before anything changes, so a caller can wait or refuse without corrupting any table.
"""

from __future__ import annotations


class PoolExhausted(RuntimeError):
    """No free block; nothing was allocated."""


class BlockAllocator:
    def __init__(self, blocks: int):
        self.total = blocks
        self.free = list(range(blocks - 1, -1, -1))
        self.refs = [0] * blocks

    @property
    def available(self) -> int:
        return len(self.free)

    def allocate(self, count: int = 1) -> list[int]:
        if count > len(self.free):
            raise PoolExhausted(f"{count} blocks wanted, {len(self.free)} of {self.total} free")
        taken = [self.free.pop() for _ in range(count)]
        for block in taken:
            self.refs[block] = 1
        return taken

    def share(self, block: int) -> None:
        if self.refs[block] < 1:
            raise ValueError(f"block {block} is free; only a live block can be shared")
        self.refs[block] += 1

    def release(self, block: int) -> None:
        if self.refs[block] < 1:
            raise ValueError(f"block {block} is already free")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)
