"""A serving-loop request as seen from an asyncio server: submit without blocking the event loop, await deltas.

The loop calls back on its own thread; each delta is handed to the event loop with call_soon_threadsafe. When the
caller stops listening (a client that went away, a cancelled task), `close` cancels the request, which frees its
KV blocks on the loop's next turn.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from mmtrt.runtime.streaming import Delta


class DeltaStream:
    def __init__(self, handle, queue: asyncio.Queue):
        self.handle, self.queue = handle, queue

    @classmethod
    async def submit(cls, loop, request, executor=None) -> DeltaStream:
        """Queue `request` on the serving loop (its checks, the prompt's tokenizing and the images' preprocessing,
        run on `executor`'s threads); raises what `ServingLoop.submit` raises (UserError, QueueFull, Unavailable)."""
        events = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta] = asyncio.Queue()

        def on_delta(delta: Delta) -> None:
            events.call_soon_threadsafe(queue.put_nowait, delta)

        handle = await events.run_in_executor(executor, lambda: loop.submit(request, None, on_delta))
        return cls(handle, queue)

    async def deltas(self) -> AsyncIterator[Delta]:
        """Every delta up to the one with a finish_reason (an "error" one carries its message)."""
        while True:
            delta = await self.queue.get()
            yield delta
            if delta.finish_reason:
                return

    def close(self) -> None:
        """Cancel the request unless it has finished; returns at once (the loop frees its places next turn)."""
        if not self.handle.done:
            self.handle.cancel(timeout=0)
