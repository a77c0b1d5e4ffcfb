"""mmtrt's side of the vLLM worker (vllm_worker.py): starting it in vLLM's environment, loading the exported folder,
and routing the worker's per-step messages to each request's callback (from a reader thread)."""

from __future__ import annotations

import itertools
import subprocess
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from mmtrt.errors import UserError
from mmtrt.handoff.vllm_env import vllm_python
from mmtrt.handoff.worker_framing import read_message, write_message

WORKER = Path(__file__).with_name("vllm_worker.py")


class VllmProcess:
    """One worker process running one vLLM engine; requests from any thread, their messages to callbacks."""

    def __init__(self, folder: Path, image_token_id: int, dtype: str = "float32", max_model_len: int = 2048,
                 max_num_seqs: int = 8, kv_cache_bytes: int = 1 << 28, python: str | None = None,
                 prefix_caching: bool = False):
        self.python = python or vllm_python()
        self.process = subprocess.Popen([self.python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.callbacks: dict[str, Callable[[dict], None]] = {}
        self.lock = threading.Lock()
        self.ids = itertools.count()
        try:
            greeting = self._read()
            if not greeting["ok"]:
                raise UserError(f"{greeting['error']}; set MMTRT_VLLM_PYTHON to a python with vLLM, or run "
                                "`python -m mmtrt.handoff.vllm_env`")
            self._send({"op": "load", "model": str(folder), "dtype": dtype, "max_model_len": max_model_len,
                        "max_num_seqs": max_num_seqs, "kv_cache_bytes": kv_cache_bytes,
                        "image_token_id": image_token_id, "prefix_caching": prefix_caching})
            loaded = self._read()
            if not loaded.get("ok"):
                raise UserError(f"vLLM could not load {folder} ({' '.join(loaded['error'].split())}); export the "
                                "bundle again with `mmtrt export hf`")
        except BaseException:
            self.close()
            raise
        self.version = loaded["vllm"]
        self.reader = threading.Thread(target=self._route, name="mmtrt-vllm-reader", daemon=True)
        self.reader.start()

    def new_id(self) -> str:
        """A request id unique in this worker (pipelines sharing it number their requests alike)."""
        return str(next(self.ids))

    def _read(self) -> dict:
        try:
            return read_message(self.process.stdout)[0]
        except EOFError:
            code = self.process.wait()
            raise UserError(f"the vLLM worker in {self.python} exited (code {code}) before answering; its log is "
                            "above") from None

    def _send(self, header: dict, arrays: dict | None = None) -> None:
        with self.lock:
            write_message(self.process.stdin, header, arrays)

    def submit(self, rid: str, ids: list[int], image_embeds: np.ndarray | None, sampling: dict, max_tokens: int,
               eos_token_ids: list[int], on_message: Callable[[dict], None], image: np.ndarray | None = None) -> None:
        """Start a request; `on_message` gets each of its messages on the reader thread, the last with a
        finish_reason ("stop", "length", "abort" or "error" with the reason). `image` (uint8 [H, W, 3]) instead of
        `image_embeds`: vLLM preprocesses and encodes it itself."""
        arrays = {"ids": np.asarray(ids, np.int64)}
        if image_embeds is not None:
            arrays["image_embeds"] = np.ascontiguousarray(image_embeds, np.float32)
        elif image is not None:
            arrays["image"] = np.ascontiguousarray(image, np.uint8)
        self.callbacks[rid] = on_message
        self._send({"op": "generate", "id": rid, "sampling": sampling, "max_tokens": max_tokens,
                    "eos_token_ids": eos_token_ids}, arrays)

    def cancel(self, rid: str) -> None:
        if rid in self.callbacks:
            self._send({"op": "cancel", "id": rid})

    def _route(self) -> None:
        while True:
            try:
                message = read_message(self.process.stdout)[0]
            except EOFError:
                for rid in list(self.callbacks):
                    self.callbacks.pop(rid)({"id": rid, "tokens": [], "finish_reason": "error",
                                             "error": "the vLLM worker exited"})
                return
            rid = message.get("id")
            callback = self.callbacks.get(rid) if message.get("finish_reason") is None else self.callbacks.pop(rid, None)
            if callback is not None:
                callback(message)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self._send({"op": "exit"})
                self.process.stdin.close()
            except OSError:
                pass
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
