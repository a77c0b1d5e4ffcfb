"""`mmtrt serve`: one loaded bundle, one serving loop, two front doors (Triton through PyTriton, and the
OpenAI-compatible HTTP endpoint), and a drain on SIGTERM.

SIGTERM (or Ctrl-C): new requests are refused (HTTP 503, a Triton error response), the queued and running ones
finish, then the HTTP server, Triton and the loop stop and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from mmtrt.errors import UserError
from mmtrt.serve.limits import Limits


@dataclass(frozen=True)
class ServeOptions:
    bundle: Path
    host: str = "127.0.0.1"
    port: int = 8080
    max_batch: int | None = None
    max_queue: int = 64
    triton_http_port: int = 8000
    triton_grpc_port: int = 8001
    triton_metrics_port: int = 8002
    allow_images: Path | None = None
    threads: int | None = None
    spin: bool = True
    triton: bool = True
    expect_digest: str | None = None
    public_key: Path | None = None
    limits: Limits = Limits()
    parse_special_tokens: bool = False
    encoder_cache_mib: float = 256
    llm: str = "bundle"  # or "vllm": vLLM runs the LLM of the exported folder (mmtrt/handoff/vllm_serve.py)
    llm_folder: Path | None = None
    vllm_dtype: str = "float32"


def model_name(bundle: Path) -> str:
    """The bundle folder's name without `.bundle`, in the characters Triton allows in a model name."""
    name = Path(bundle).resolve().name.removesuffix(".bundle")
    return re.sub(r"[^A-Za-z0-9._-]", "-", name) or "model"


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening socket (port 0: a free one, known before anyone connects)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port or --host") from None
    sock.listen(128)
    return sock


def free_port(host: str, port: int) -> int:
    """`port`, or a free one for 0 (Triton takes no port 0)."""
    if port:
        return port
    with listening_socket(host, 0) as sock:
        return sock.getsockname()[1]


def serve(options: ServeOptions) -> int:
    from mmtrt.runtime import load
    from mmtrt.runtime.serving_loop import ServingLoop
    if options.allow_images is not None and not options.allow_images.is_dir():
        raise UserError(f"--allow-images {options.allow_images} is not a folder; pass the folder images may be read from")
    name, images = model_name(options.bundle), options.limits.images(options.allow_images)
    sock = listening_socket(options.host, options.port)
    if options.llm == "vllm":
        from mmtrt.handoff.vllm_serve import open_serving

        pipe, loop = open_serving(options)
    else:
        pipe = load(options.bundle, threads=options.threads, spin=options.spin, expect_digest=options.expect_digest,
                    public_key=options.public_key, parse_special_tokens=options.parse_special_tokens,
                    encoder_cache_mib=options.encoder_cache_mib)
        loop = ServingLoop(pipe, options.max_batch, options.max_queue)
    pool = options.limits.pool()
    triton = None
    try:
        if options.triton:
            triton = _start_triton(loop, pipe, name, images, options, pool)
        print(f"mmtrt: serving {name} (max batch {loop.scheduler.max_batch}, queue {options.max_queue}); "
              f"OpenAI endpoint http://{_url_host(options.host)}:{sock.getsockname()[1]}/v1", flush=True)
        asyncio.run(_run_http(loop, pipe, name, images, sock, options.limits, pool))
    finally:
        if triton is not None:
            triton.stop()
        loop.close()
        pool.shutdown(wait=False, cancel_futures=True)
    print("mmtrt: drained and stopped", flush=True)
    return 0


def _start_triton(loop, pipe, name, images, options: ServeOptions, pool):
    from mmtrt.serve.triton_binding import TritonPorts, start_triton

    ports = TritonPorts(*(free_port(options.host, p) for p in
                          (options.triton_http_port, options.triton_grpc_port, options.triton_metrics_port)))
    triton = start_triton(loop, pipe, name, images, ports, options.host, options.limits, pool)
    host = _url_host(options.host)
    print(f"mmtrt: Triton model {name!r}: HTTP {host}:{ports.http}, gRPC {host}:{ports.grpc}, "
          f"metrics http://{host}:{ports.metrics}/metrics", flush=True)
    return triton


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _http_server(config):
    import uvicorn

    class Server(uvicorn.Server):
        """Leaves the signals to `_run_http` (uvicorn's own handling re-raises a SIGTERM at exit: status 143)."""

        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server(config)


async def _run_http(loop, pipe, name, images, sock: socket.socket, limits: Limits, pool) -> None:
    import uvicorn

    from mmtrt.serve.openai_app import create_app

    draining = threading.Event()
    app = create_app(loop, pipe, name, images, lambda: "draining" if draining.is_set() else "open", limits, pool)
    server = _http_server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=30))
    events = asyncio.get_running_loop()

    async def drain() -> None:
        print("mmtrt: draining: new requests are refused, running ones finish", file=sys.stderr, flush=True)
        await asyncio.to_thread(loop.drain)
        server.should_exit = True

    def on_signal() -> None:
        if not draining.is_set():
            draining.set()
            events.create_task(drain())

    for sig in (signal.SIGTERM, signal.SIGINT):
        events.add_signal_handler(sig, on_signal)
    await server.serve(sockets=[sock])
