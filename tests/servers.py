"""A real `mmtrt serve` process on free local ports, and the requests the serving tests send it."""

from __future__ import annotations

import base64
import io
import json
import os
import queue
import re
import subprocess
import sys
import time

import urllib.error
import urllib.request

import numpy as np

from mmtrt.runtime.chat import chat_request

START_TIMEOUT_S = 180


class Server:
    def __init__(self, bundle, *options: str, triton: bool = True, env: dict | None = None):
        ports = ["--port", "0"] + (["--triton-http-port", "0", "--triton-grpc-port", "0", "--triton-metrics-port", "0"]
                                   if triton else ["--no-triton"])
        self.process = subprocess.Popen([sys.executable, "-m", "mmtrt.cli", "serve", str(bundle), *ports, *options],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, **(env or {})})
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        _pump(self.process.stdout, self.lines)
        self.url = self.grpc = self.triton_metrics = None
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.url is None or (triton and self.grpc is None):
            line = self._next_line(deadline)
            self.stdout.append(line)
            if m := re.search(r"gRPC (\S+), metrics (\S+)", line):
                self.grpc, self.triton_metrics = m.group(1).rstrip(","), m.group(2)
            if m := re.search(r"OpenAI endpoint (\S+)", line):
                self.url = m.group(1)

    def _next_line(self, deadline: float) -> str:
        while True:
            try:
                return self.lines.get(timeout=1)
            except queue.Empty:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.process.kill()
                    raise RuntimeError(f"mmtrt serve did not start: {self.process.stderr.read()[-3000:]}")

    def metrics(self) -> dict[str, float]:
        text = urllib.request.urlopen(self.url.removesuffix("/v1") + "/metrics", timeout=30).read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(mmtrt_\w+)\{[^}]*\} (\S+)$", text, re.M)}

    def wait_idle(self, timeout: float = 10) -> dict[str, float]:
        """The metrics once nothing runs or waits and every KV block is free (the last seen on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = m["mmtrt_running_requests"] == m["mmtrt_queue_length"] == m["mmtrt_kv_blocks_used"] == 0
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.05)

    def post(self, path: str, data: bytes) -> tuple[int, dict]:
        """A raw POST: the status and the JSON it answered."""
        request = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def rest_of_output(self, timeout: float = 10) -> str:
        """What the process printed after start-up, once it has exited."""
        lines, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                lines.append(self.lines.get(timeout=0.2))
            except queue.Empty:
                if self.process.poll() is not None:
                    break
        return "".join(lines)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _pump(stream, lines: queue.Queue) -> None:
    import threading

    def run():
        for line in stream:
            lines.put(line)

    threading.Thread(target=run, daemon=True).start()


def data_uri(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def messages(image, text: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": data_uri(image)}}] if image is not None else []
    return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]


def solo(pipe, body: dict):
    """The request run alone on a loaded pipeline, as `mmtrt run` runs one."""
    from mmtrt.serve.protocol import sampling_params

    return pipe.generate_batch([chat_request(pipe, body["messages"], sampling_params(body))])[0]


def triton_stream(grpc_url: str, model: str, bodies: list[dict], timeout: float = 120) -> list[dict]:
    """Each body through Triton's gRPC streaming API (tritonclient): its tokens, text, finish_reason and error."""
    outs = triton_raw(grpc_url, model, [json.dumps(body).encode() for body in bodies], timeout)
    for out in outs:
        assert not out.pop("stream_error"), out
    return outs


def triton_raw(grpc_url: str, model: str, payloads: list[bytes], timeout: float = 120) -> list[dict]:
    """Each payload as the `request` input: its tokens, text, finish_reason, error, and any error Triton's stream
    reported instead of a response ("stream_error")."""
    import tritonclient.grpc as grpcclient

    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    out = {str(i): {"token_ids": [], "text": "", "finish_reason": "", "error": "", "stream_error": ""}
           for i in range(len(payloads))}
    for i, payload in enumerate(payloads):
        tensor = grpcclient.InferInput("request", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([payload], dtype=np.object_))
        client.async_stream_infer(model, [tensor], request_id=str(i), enable_empty_final_response=True)
    finals = 0
    try:
        while finals < len(payloads):
            result, error = events.get(timeout=timeout)
            if error is not None:  # it names no request: send one payload to know whose it is
                out[str(finals)]["stream_error"] = str(error)
                finals += 1
                continue
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
                continue
            entry = out[response.id]
            entry["token_ids"] += result.as_numpy("token_ids").tolist()
            entry["text"] += result.as_numpy("text")[0].decode()
            entry["finish_reason"] = result.as_numpy("finish_reason")[0].decode()
            entry["error"] = result.as_numpy("error")[0].decode()
    finally:
        client.stop_stream()
        client.close()
    return [out[str(i)] for i in range(len(payloads))]
