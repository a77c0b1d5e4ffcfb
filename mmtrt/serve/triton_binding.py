"""The serving loop as a model of Triton Inference Server, through PyTriton (imported here only, lazily).

PyTriton starts its own `tritonserver` and binds a Python callable as a model; with `decoupled` the callable is
an async generator and every yield is one streamed response. Triton's batching is off (one request per call): the
serving loop does the batching, between decode steps. Triton gives the callable no cancellation, so a gRPC client
that goes away leaves its request to run to its token limit; the OpenAI endpoint cancels on disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mmtrt.errors import UserError
from mmtrt.runtime.serving_loop import Unavailable
from mmtrt.serve import backend_env, triton_io
from mmtrt.serve.bridge import DeltaStream
from mmtrt.serve.errors import one_line
from mmtrt.serve.limits import Limits
from mmtrt.serve.protocol import ImageSource, prepare

log = logging.getLogger("mmtrt.serve")


@dataclass(frozen=True)
class TritonPorts:
    http: int
    grpc: int
    metrics: int


def infer_function(loop, pipe, model_name: str, images: ImageSource, limits: Limits, pool):
    async def infer(requests):
        for request in requests:  # one per call: Triton's batching is off
            async for outputs in _responses(loop, pipe, model_name, images, request.data.get("request"), limits,
                                            pool):
                yield [outputs]

    return infer


def _raw(tensor) -> bytes:
    try:
        [value] = tensor.reshape(-1)
    except (AttributeError, ValueError):
        value = None
    if not isinstance(value, bytes):
        raise UserError("input `request` must be one BYTES element holding a chat completion body's JSON")
    return value


async def _responses(loop, pipe, model_name: str, images: ImageSource, tensor, limits: Limits, pool):
    try:
        raw = _raw(tensor)
        call = await asyncio.get_running_loop().run_in_executor(pool, prepare, pipe, model_name, raw, images, limits,
                                                                True)
        stream = await DeltaStream.submit(loop, call.request, pool)
    except (UserError, Unavailable) as exc:  # Unavailable includes QueueFull
        yield triton_io.response(finish_reason="error", error=one_line(str(exc)))
        return
    except Exception:
        log.exception("a Triton request failed")
        yield triton_io.response(finish_reason="error", error="the server failed on this request (an internal "
                                 "error, logged on the server)")
        return
    try:
        async for delta in stream.deltas():
            yield triton_io.response(delta.token_ids, delta.text, delta.finish_reason, delta.error)
    finally:
        stream.close()


def start_triton(loop, pipe, model_name: str, images: ImageSource, ports: TritonPorts, host: str,
                 limits: Limits = Limits(), pool=None):
    """Start tritonserver with the model bound and ready; returns the PyTriton `Triton` (call `stop()`)."""
    import numpy as np
    import pytriton.server.triton_server as triton_server
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    stub_env = backend_env.prepare()
    triton_server.get_triton_python_backend_python_env = lambda: stub_env  # PyTriton's one hook for the stub's env
    os.environ.update(backend_env.server_environment(stub_env))
    logs = Path(tempfile.mkdtemp(prefix="mmtrt-triton-")) / "tritonserver.log"
    config = TritonConfig(http_address=host, http_port=ports.http, grpc_address=host, grpc_port=ports.grpc,
                          metrics_address=host, metrics_port=ports.metrics, log_file=logs, exit_timeout_secs=5)
    triton = Triton(config=config)
    triton.bind(model_name=model_name, infer_func=infer_function(loop, pipe, model_name, images, limits,
                                                                           pool or limits.pool()),
                inputs=[Tensor(name=n, dtype=_dtype(np, d), shape=s) for n, d, s in triton_io.INPUTS],
                outputs=[Tensor(name=n, dtype=_dtype(np, d), shape=s) for n, d, s in triton_io.OUTPUTS],
                config=ModelConfig(batching=False, decoupled=True))
    try:
        triton.run()
    except Exception as exc:
        triton.stop()
        raise UserError(f"Triton Inference Server did not start ({exc}); its log is {logs}") from None
    log.info("tritonserver log: %s", logs)
    return triton


def _dtype(np, dtype):
    return bytes if dtype is np.object_ else dtype
