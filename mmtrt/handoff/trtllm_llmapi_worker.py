"""The TensorRT-LLM LLM API worker: a process in TensorRT-LLM's own environment (MMTRT_TRTLLM_PYTHON) that loads a
folder `mmtrt export hf --format modelopt` wrote with `tensorrt_llm.LLM(model=FOLDER)` and generates from a text
prompt plus the bundle's image embeddings, which mmtrt computes (handoff/trtllm_llmapi.py builds the requests).

Protocol: worker_framing.py's messages. A greeting ({"ok": true, "tensorrt_llm": version} or {"ok": false,
"error": why}), then `load` (folder, dtype), `generate` (prompt, max_new_tokens; arrays image_0.. [tokens, hidden]),
`exit`. TensorRT-LLM prints to stdout, so the protocol keeps a duplicate of it and stdout goes to stderr.

The embeddings go as TensorRT-LLM documents precomputed ones (NVIDIA/TensorRT-LLM): tensorrt_llm/llmapi/llm.py
`BaseLLM.generate_async` hands `inputs["multi_modal_embeddings"]` of a request with a text `prompt` to the model's
input processor's `attach_multimodal_embeddings` (a request of prompt_token_ids is decoded to text and loses the
embeddings there, so the prompt goes as text); tensorrt_llm/_torch/models/modeling_llava_next.py
`LlavaNextInputProcessor.attach_multimodal_embeddings` takes {"image": [tensor [tokens, hidden] per image]} and a
prompt with one image token per image, which it expands to the embeddings' count. NOT RUN: tensorrt_llm does not
install where this was written; the missing-import greeting is tested.
"""

import os
import sys
from pathlib import Path

if __package__:  # imported by mmtrt
    from mmtrt.handoff.worker_framing import read_message, write_message
else:  # a script in TensorRT-LLM's environment, beside worker_framing.py
    from worker_framing import read_message, write_message


class Worker:
    def __init__(self):
        self.llm = None

    def load(self, header: dict, arrays: dict) -> tuple[dict, dict]:
        from tensorrt_llm import LLM

        self.llm = LLM(model=header["folder"], dtype=header.get("dtype", "auto"))
        return {"ok": True}, {}

    def generate(self, header: dict, arrays: dict) -> tuple[dict, dict]:
        import numpy as np
        import torch
        from tensorrt_llm import SamplingParams

        if self.llm is None:
            return {"ok": False, "error": "generate before load"}, {}
        images = [torch.from_numpy(np.ascontiguousarray(arrays[f"image_{i}"])) for i in range(len(arrays))]
        inputs = {"prompt": header["prompt"], "multi_modal_embeddings": {"image": images}}
        output = self.llm.generate(inputs, SamplingParams(max_tokens=header["max_new_tokens"], top_k=1))
        return {"ok": True, "token_ids": list(output.outputs[0].token_ids)}, {}


def main() -> int:
    # run as a script, this file's folder leads sys.path: keep mmtrt's modules beside it out of the import path
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        import tensorrt_llm
    except Exception as exc:  # a broken install fails with more than ImportError
        error = f"tensorrt_llm is not importable in {sys.executable} ({type(exc).__name__}: {exc}); " \
                "set MMTRT_TRTLLM_PYTHON to the Python of an environment with tensorrt-llm"
        write_message(protocol, {"ok": False, "error": " ".join(error.split())})
        return 0
    write_message(protocol, {"ok": True, "tensorrt_llm": tensorrt_llm.__version__, "python": sys.executable})
    worker = Worker()
    while True:
        try:
            header, arrays = read_message(sys.stdin.buffer)
        except EOFError:
            return 0
        if header["op"] == "exit":
            return 0
        op = {"load": worker.load, "generate": worker.generate}.get(header["op"])
        try:
            reply = op(header, arrays) if op else ({"ok": False, "error": f"unknown op {header['op']!r}"}, {})
        except Exception as exc:
            reply = {"ok": False, "error": f"{header['op']} failed: {type(exc).__name__}: {exc}"}, {}
        write_message(protocol, *reply)


if __name__ == "__main__":
    sys.exit(main())
