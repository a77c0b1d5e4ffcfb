"""The serving loop behind an exported Triton model: a process of mmtrt's own Python, spoken to in JSON lines.

Triton's Python backend runs a model in its stub's Python environment, which may differ from ours (its numpy,
its Python version): the exported model.py therefore imports nothing of mmtrt and starts this worker instead.
Standard input takes `{"id": ..., "body": "<chat completion JSON>"}` and `{"id": ..., "cancel": true}`; standard
output gives `{"ready": true}` once loaded, then per decode step `{"id", "token_ids", "text", "finish_reason",
"error"}` (the Triton model's outputs). End of input drains: running requests finish, then the worker exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import traceback
from pathlib import Path

from mmtrt.errors import UserError
from mmtrt.serve.errors import one_line
from mmtrt.serve.limits import Limits


class Worker:
    def __init__(self, loop, pipe, name: str, images, out):
        self.loop, self.pipe, self.name, self.images, self.out = loop, pipe, name, images, out
        self.handles: dict[str, object] = {}
        self.lock = threading.Lock()

    def send(self, rid: str, token_ids=(), text: str = "", finish_reason: str | None = None,
             error: str | None = None) -> None:
        line = json.dumps({"id": rid, "token_ids": list(token_ids), "text": text, "finish_reason": finish_reason,
                           "error": error})
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()
            if finish_reason:
                self.handles.pop(rid, None)

    def handle(self, message: dict) -> None:
        from mmtrt.runtime.serving_loop import Unavailable
        from mmtrt.serve.protocol import prepare

        rid = str(message.get("id"))
        if message.get("cancel"):
            with self.lock:
                handle = self.handles.get(rid)
            if handle is not None:
                handle.cancel(timeout=0)
            return
        try:
            request = prepare(self.pipe, self.name, str(message.get("body") or "").encode(), self.images, Limits(),
                              triton=True).request
            with self.lock:  # registered before its first delta can finish it
                self.handles[rid] = self.loop.submit(request, None, lambda d: self.send(
                    rid, d.token_ids, d.text, d.finish_reason, d.error))
        except (UserError, Unavailable) as exc:
            self.send(rid, finish_reason="error", error=one_line(str(exc)))
        except Exception:  # one request's failure, logged here; the worker serves on
            traceback.print_exc(file=sys.stderr)
            self.send(rid, finish_reason="error", error="the server failed on this request (an internal error, "
                      "logged on the server)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmtrt.serve.worker")
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--max-batch", type=int)
    parser.add_argument("--max-queue", type=int, default=64)
    parser.add_argument("--allow-images", type=Path)
    args = parser.parse_args(argv)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed goes to the log, not into the protocol

    from mmtrt.runtime import load
    from mmtrt.runtime.serving_loop import ServingLoop
    pipe = load(args.bundle)
    with ServingLoop(pipe, args.max_batch, args.max_queue) as loop:
        worker = Worker(loop, pipe, args.name, Limits().images(args.allow_images), out)
        out.write(json.dumps({"ready": True, "max_batch": loop.scheduler.max_batch}) + "\n")
        out.flush()
        for line in sys.stdin:
            if line.strip():
                worker.handle(json.loads(line))
        loop.drain()
    return 0


if __name__ == "__main__":
    sys.exit(main())
