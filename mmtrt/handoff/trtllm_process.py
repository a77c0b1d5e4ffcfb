"""mmtrt's side of the TensorRT-LLM worker (trtllm_worker.py): which Python runs it, starting it, a request and its
answer, and the host probe. The Python is MMTRT_TRTLLM_PYTHON, the interpreter of the environment where tensorrt-llm
is installed; without it, this interpreter, whose environment holds mmtrt and therefore no TensorRT-LLM release can
import there: the worker then answers why, and the LLM runs on ONNX Runtime with that reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from mmtrt.handoff.worker_framing import read_message, write_message

ENV = "MMTRT_TRTLLM_PYTHON"
WORKER = Path(__file__).with_name("trtllm_worker.py")
HINT = (f"install tensorrt-llm in an environment of its own (it pins TensorRT 10, numpy<2 and its own torch) and set "
        f"{ENV} to that environment's python")


class WorkerUnavailable(RuntimeError):
    """The worker cannot run TensorRT-LLM; the message says why."""


def trtllm_python() -> str:
    return os.environ.get(ENV) or sys.executable


def build_executable(python: str) -> list[str]:
    """trtllm-build of the worker's environment (its console script beside its python, else the module)."""
    script = Path(python).parent / "trtllm-build"
    return [str(script)] if script.is_file() else [python, "-m", "tensorrt_llm.commands.build"]


class TrtllmProcess:
    """One worker process; requests go one at a time."""

    def __init__(self, python: str | None = None, worker: Path = WORKER):
        self.python = python or trtllm_python()
        if shutil.which(self.python) is None and not Path(self.python).is_file():
            raise WorkerUnavailable(f"{ENV}={self.python} is not an executable; {HINT}")
        self.process = subprocess.Popen([self.python, str(worker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            greeting, _ = read_message(self.process.stdout)
        except EOFError:
            self.close()
            raise WorkerUnavailable(f"the TensorRT-LLM worker in {self.python} exited before greeting; {HINT}") from None
        if not greeting["ok"]:
            self.close()
            raise WorkerUnavailable(f"{greeting['error']}; {HINT}")
        self.version = greeting["tensorrt_llm"]

    def call(self, op: str, arrays: dict | None = None, **fields) -> tuple[dict, dict]:
        """Send one request and wait for its answer; a refused request raises WorkerUnavailable with the reason."""
        write_message(self.process.stdin, {"op": op, **fields}, arrays)
        header, out = read_message(self.process.stdout)
        if not header["ok"]:
            raise WorkerUnavailable(f"the TensorRT-LLM worker: {header['error']}")
        return header, out

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                write_message(self.process.stdin, {"op": "exit"})
                self.process.stdin.close()
            except OSError:
                pass
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@lru_cache(maxsize=None)
def probe(python: str) -> tuple[str, str] | str:
    """(compute capability, tensorrt_llm version) of the worker environment's GPU, or why it cannot run engines;
    asked once per interpreter and process."""
    try:
        worker = TrtllmProcess(python)
    except WorkerUnavailable as exc:
        return str(exc)
    try:
        found, _ = worker.call("probe")
        return found["compute_capability"], found["tensorrt_llm"]
    except WorkerUnavailable as exc:
        return str(exc)
    finally:
        worker.close()
