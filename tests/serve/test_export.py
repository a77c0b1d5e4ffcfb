"""`mmtrt export triton`: the repository it writes is served by a stock `tritonserver` (the binary and Python
backend that nvidia-pytriton ships, started on the repository directly, no PyTriton code in between)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builders import random_image
from mmtrt.cli import main
from mmtrt.runtime import load
from mmtrt.serve import backend_env
from mmtrt.serve.server import free_port
from servers import messages, solo, triton_stream


def stock_tritonserver(repository: Path, work: Path):
    """tritonserver on `repository` with the Python backend laid out as in NVIDIA's container."""
    import pytriton

    dist = Path(pytriton.__file__).parent / "tritonserver"
    backend = work / "backends" / "python"
    shutil.copytree(dist / "backends" / "python", backend)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    shutil.copy(dist / "python_backend_stubs" / version / "triton_python_backend_stub", backend)
    env = {**os.environ, **backend_env.server_environment(backend_env.prepare())}
    env["LD_LIBRARY_PATH"] += f":{dist.parent.parent / 'nvidia_pytriton.libs'}"
    grpc = free_port("127.0.0.1", 0)
    ports = [f"--http-port={free_port('127.0.0.1', 0)}", f"--grpc-port={grpc}",
             f"--metrics-port={free_port('127.0.0.1', 0)}"]
    process = subprocess.Popen([str(dist / "bin" / "tritonserver"), f"--model-repository={repository}",
                                f"--backend-directory={work / 'backends'}", "--exit-timeout-secs=30", *ports],
                               stdout=open(work / "tritonserver.log", "w"), stderr=subprocess.STDOUT, env=env)
    return process, f"127.0.0.1:{grpc}"


def wait_ready(grpc: str, model: str, process, log: Path, timeout: float = 180) -> None:
    import tritonclient.grpc as grpcclient

    client, deadline = grpcclient.InferenceServerClient(grpc), time.monotonic() + timeout
    while True:
        try:
            if client.is_model_ready(model):
                return
        except Exception:
            pass
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)


def test_a_stock_tritonserver_serves_the_exported_repository(tiny_paged_bundle, tmp_path, rng):
    repository = tmp_path / "repository"
    assert main(["export", "triton", str(tiny_paged_bundle), str(repository), "--max-queue", "8"]) == 0
    model = repository / "paged"
    assert sorted(p.name for p in model.iterdir()) == ["1", "config.pbtxt"]
    assert (model / "1" / "bundle" / "manifest.json").read_bytes() == (tiny_paged_bundle / "manifest.json").read_bytes()
    assert "decoupled: true" in (model / "config.pbtxt").read_text()
    assert main(["export", "triton", str(tiny_paged_bundle), str(repository)]) == 2  # exists: --force replaces

    process, grpc = stock_tritonserver(repository, tmp_path)
    try:
        wait_ready(grpc, "paged", process, tmp_path / "tritonserver.log")
        pipe = load(tiny_paged_bundle)
        bodies = [{"max_tokens": int(rng.integers(4, 33)), "messages": messages(
            random_image(rng, 40, 56), " ".join(rng.choice(["red", "cat", "blue"], int(rng.integers(1, 9)))))}
            for _ in range(3)] + [{"max_tokens": 0, "messages": messages(None, "hi")}]
        results = triton_stream(grpc, "paged", bodies)
        for b, out in zip(bodies[:3], results):
            reference = solo(pipe, b)
            assert (out["token_ids"], out["text"], out["error"]) == (reference.token_ids, reference.text, "")
        assert results[3]["finish_reason"] == "error" and "max_new_tokens 0 is outside" in results[3]["error"]
    finally:
        process.terminate()
        assert process.wait(60) == 0
