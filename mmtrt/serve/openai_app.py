"""The OpenAI-compatible HTTP endpoint (FastAPI): /v1/models, /v1/chat/completions (JSON, or server-sent events
with `stream: true`), /health, /ready and /metrics (Prometheus text: the serving loop's figures).

Status codes: 400 for a bad request (one line in error.message), 413 for a body over --max-body-bytes, 404 and 405
for another route or method (serve/errors.py: OpenAI's error shape for all), 429 when the queue is full, 503 while
draining. The body is parsed, its images decoded and its prompt tokenized on the limits' thread pool
(serve/limits.py), never on the event loop. A streaming client that disconnects has its request cancelled, which
frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from mmtrt.errors import UserError
from mmtrt.runtime.serving_loop import QueueFull, Unavailable
from mmtrt.serve import errors
from mmtrt.serve.bridge import DeltaStream
from mmtrt.serve.errors import error, one_line
from mmtrt.serve.limits import Limits, TooLarge
from mmtrt.serve.metrics import prometheus_text
from mmtrt.serve.protocol import ChatCall, ImageSource, prepare

DISCONNECT_POLL_S = 0.5
DRAIN = 4


def create_app(loop, pipe, model_name: str, images: ImageSource, state=lambda: "open", limits: Limits = Limits(),
               pool=None) -> FastAPI:
    """`state()`: "open", or "draining" after SIGTERM (then /ready answers 503). `pool`: the threads that prepare
    requests (default: the limits' own)."""
    app = FastAPI(title="mmtrt", docs_url=None, redoc_url=None, openapi_url=None)
    errors.install(app)
    created = int(time.time())
    pool = pool or limits.pool()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "mmtrt"}]}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        now = state()
        return JSONResponse({"status": now}, status_code=200 if now == "open" else 503)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(prometheus_text(loop.metrics(), model_name))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        try:
            raw = await _body(request, limits)
            call = await asyncio.get_running_loop().run_in_executor(
                pool, prepare, pipe, model_name, raw, images, limits)
            stream = await DeltaStream.submit(loop, call.request, pool)
        except TooLarge as exc:
            return error(413, str(exc), "invalid_request_error")
        except UserError as exc:
            return error(400, str(exc), "invalid_request_error")
        except QueueFull as exc:
            return error(429, str(exc), "rate_limit_error")
        except Unavailable as exc:
            return error(503, str(exc), "unavailable_error")
        reply = Reply(model_name, stream.handle.prompt_tokens)
        if call.stream:
            return StreamingResponse(_events(request, stream, reply, call), media_type="text/event-stream")
        return await _complete(request, stream, reply)

    return app


async def _body(request: Request, limits: Limits) -> bytes:
    """The body, kept no further than the limit. The rest of a larger one is read and dropped (up to DRAIN times the
    limit, then the connection is dropped) so that its client reads the 413 rather than a reset connection."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limits.max_body_bytes:
            chunks.append(chunk)
        elif size > DRAIN * limits.max_body_bytes:
            break
    limits.check_body(size)
    return b"".join(chunks)


class Reply:
    """The OpenAI objects of one completion."""

    def __init__(self, model: str, prompt_tokens: int):
        self.id, self.model, self.created = f"chatcmpl-{uuid.uuid4().hex}", model, int(time.time())
        self.prompt_tokens, self.completion_tokens = prompt_tokens, 0

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def chunk(self, delta: dict, finish_reason: str | None, token_ids=(), usage: bool = False) -> str:
        """One event; `token_ids` (the step's tokens) is an extension field beside OpenAI's."""
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "token_ids": list(token_ids)}
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [] if usage else [choice]}
        if usage:
            body["usage"] = self.usage()
        return f"data: {json.dumps(body)}\n\n"

    def completion(self, text: str, token_ids: list[int], finish_reason: str) -> dict:
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": finish_reason, "token_ids": token_ids}],
                "usage": self.usage()}


async def _watched(request: Request, stream: DeltaStream):
    """The request's deltas while the client is there (checked after each delta, and every DISCONNECT_POLL_S while
    none comes); the caller's finally then cancels the rest."""
    iterator = stream.deltas().__aiter__()
    while True:
        step = asyncio.ensure_future(iterator.__anext__())
        while not step.done():
            await asyncio.wait([step], timeout=DISCONNECT_POLL_S)
            if not step.done() and await request.is_disconnected():
                step.cancel()
                return
        try:
            delta = step.result()
        except StopAsyncIteration:
            return
        yield delta
        if not delta.finish_reason and await request.is_disconnected():
            return


async def _events(request: Request, stream: DeltaStream, reply: Reply, call: ChatCall):
    try:
        yield reply.chunk({"role": "assistant", "content": ""}, None)
        async for delta in _watched(request, stream):
            if delta.finish_reason == "error":
                yield f"data: {json.dumps({'error': {'message': one_line(delta.error), 'type': 'server_error'}})}\n\n"
                return
            reply.completion_tokens += len(delta.token_ids)
            yield reply.chunk({"content": delta.text} if delta.text else {}, delta.finish_reason, delta.token_ids)
        if call.include_usage:
            yield reply.chunk({}, None, usage=True)
        yield "data: [DONE]\n\n"
    finally:
        stream.close()


async def _complete(request: Request, stream: DeltaStream, reply: Reply):
    text, token_ids, reason = [], [], None
    try:
        async for delta in _watched(request, stream):
            if delta.finish_reason == "error":
                return error(500, delta.error or "the request failed", "server_error")
            text.append(delta.text)
            token_ids.extend(delta.token_ids)
            reason = delta.finish_reason
    finally:
        stream.close()
    reply.completion_tokens = len(token_ids)
    return reply.completion("".join(text), token_ids, reason or "abort")
