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
    """One worker process running one vLLM engine; requests from any thread, their messages to callbacks. The
    process starts (and imports vLLM, seconds) at construction; `load` waits for it, then loads the folder, so
    whatever the caller does in between (loading the bundle's vision side, compiling) overlaps the import."""

    def __init__(self, python: str | None = None):
        self.python = python or vllm_python()
        self.process = subprocess.Popen([self.python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.callbacks: dict[str, Callable[[dict], None]] = {}
        self.exited: str | None = None  # once the worker is gone: why every later request fails at once
        self.lock = threading.Lock()
        self.ids = itertools.count()
        self.version = None  # vLLM's, once loaded

    def load(self, folder: Path, image_token_id: int, dtype: str = "float32", max_model_len: int = 2048,
             max_num_seqs: int = 8, kv_cache_bytes: int = 1 << 28, prefix_caching: bool = False) -> VllmProcess:
        """The engine on `folder`; closes the process when it cannot be had."""
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
                fix = loaded.get("fix") or "export the bundle again with `mmtrt export hf`"
                raise UserError(f"vLLM could not load {folder} ({' '.join(loaded['error'].split())}); {fix}")
        except BaseException:
            self.close()
            raise
        self.version = loaded["vllm"]
        threading.Thread(target=self._route, name="mmtrt-vllm-reader", daemon=True).start()
        return self

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

    def submit(self, rid: str, ids: list[int], image_inputs: dict[str, np.ndarray] | None, sampling: dict,
               max_tokens: int, eos_token_ids: list[int], on_message: Callable[[dict], None],
               image: np.ndarray | None = None, prompt_ranks: bool = False) -> None:
        """Start a request; `on_message` gets each of its messages on the reader thread, the last with a
        finish_reason ("stop", "length", "abort" or "error" with the reason). `image_inputs`: the image's
        `image_embeds` [1, count, hidden] (and Qwen2-VL's `image_grid_thw` [1, 3]); `image` (uint8 [H, W, 3])
        instead: vLLM preprocesses and encodes it itself. `prompt_ranks`: the first message holds each prompt
        token's rank in vLLM's logits before it (vllm_worker.py)."""
        arrays = {"ids": np.asarray(ids, np.int64)}
        if image_inputs is not None:
            arrays["image_embeds"] = np.ascontiguousarray(image_inputs["image_embeds"], np.float32)
            if "image_grid_thw" in image_inputs:
                arrays["image_grid_thw"] = np.asarray(image_inputs["image_grid_thw"], np.int64)
        elif image is not None:
            arrays["image"] = np.ascontiguousarray(image, np.uint8)
        header = {"op": "generate", "id": rid, "sampling": sampling, "max_tokens": max_tokens,
                  "eos_token_ids": eos_token_ids, "prompt_ranks": prompt_ranks}
        with self.lock:
            if self.exited is None:
                self.callbacks[rid] = on_message
                try:
                    write_message(self.process.stdin, header, arrays)
                except OSError:  # the worker is going: the reader fails the request at its end of output
                    pass
                return
        on_message({"id": rid, "tokens": [], "finish_reason": "error", "error": self.exited})

    def prompt_ranks(self, ids: list[int], image_inputs: dict[str, np.ndarray] | None = None,
                     image: np.ndarray | None = None, timeout_s: float = 600) -> list[int]:
        """Each token's rank in vLLM's logits at the position before it (1: vLLM's argmax; 0 for the first), for a
        prompt fed whole: what teacher forcing reads."""
        import queue

        messages: queue.SimpleQueue = queue.SimpleQueue()
        greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, "repetition_penalty": 1.0}
        self.submit(self.new_id(), ids, image_inputs, greedy, 1, [], messages.put, image, prompt_ranks=True)
        ranks = None
        while True:
            message = messages.get(timeout=timeout_s)
            ranks = message.get("prompt_ranks", ranks)
            if message["finish_reason"] == "error":
                raise UserError(f"vLLM: {message['error']}")
            if message["finish_reason"]:
                return ranks

    def cancel(self, rid: str) -> None:
        if rid in self.callbacks:
            self._send({"op": "cancel", "id": rid})

    def _route(self) -> None:
        while True:
            try:
                message = read_message(self.process.stdout)[0]
            except EOFError:
                with self.lock:
                    self.exited = f"the vLLM worker exited (code {self.process.wait()}); its log is above"
                    orphans, self.callbacks = self.callbacks, {}
                for rid, callback in orphans.items():
                    callback({"id": rid, "tokens": [], "finish_reason": "error", "error": self.exited})
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
