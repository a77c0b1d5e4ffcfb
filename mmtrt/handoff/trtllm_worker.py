"""The TensorRT-LLM worker: a process in the environment where tensorrt-llm is installed, which mmtrt speaks to over
the worker's stdin and stdout.

TensorRT-LLM cannot share mmtrt's environment or process: its releases pin TensorRT 10, numpy < 2 and an older
torch, where mmtrt needs TensorRT 11 (or TensorRT-RTX), numpy 2 and its own torch. So the user installs it in an
environment of its own and names that environment's Python in MMTRT_TRTLLM_PYTHON; mmtrt starts this file there as a
script (`python trtllm_worker.py`, so it imports nothing of mmtrt, and numpy and torch only where they are needed).

Protocol: worker_framing.py's messages, both ways. The worker first sends a greeting
({"ok": true, "tensorrt_llm": version} or {"ok": false, "error": why}), then answers each request in turn: `probe`
(the GPU's compute capability), `load` (an engine folder: ModelRunnerCpp.from_dir), `generate` (prompts and their
prompt tables, and M-RoPE's cos/sin and deltas: ModelRunnerCpp.generate), `exit`. TensorRT-LLM prints to stdout,
so the protocol keeps a duplicate of the original stdout and the worker's own stdout goes to stderr.

NOT RUN: tensorrt_llm cannot be installed where this was written; the calls follow ModelRunnerCpp as
tensorrt_llm/runtime/model_runner_cpp.py (NVIDIA/TensorRT-LLM) defines it, and MropeParams as
tensorrt_llm/layers/attention.py does. The framing, the missing-import path and `engine_mrope` (on a checkpoint
config) are tested.
"""

import json
import os
import sys
import time
from pathlib import Path

if __package__:  # imported by mmtrt
    from mmtrt.handoff.worker_framing import read_message, write_message
else:  # a script in TensorRT-LLM's environment, beside worker_framing.py
    from worker_framing import read_message, write_message


def engine_mrope(pretrained: dict) -> dict | None:
    """What the runner needs to compute an M-RoPE engine's cos/sin (mmtrt/handoff/trtllm_runner.py: mrope_cos_sin), from
    the checkpoint config the engine was built from (QWenConfig, qwen_type qwen2_vl); None for any other engine."""
    if pretrained.get("position_embedding_type") != "mrope":
        return None
    return {"head_size": pretrained["head_size"], "rotary_base": pretrained["rotary_base"],
            "max_position_embeddings": pretrained["max_position_embeddings"],
            "mrope_section": pretrained["rotary_scaling"]["mrope_section"]}


class Worker:
    def __init__(self):
        self.runner = None

    def probe(self, header: dict, arrays: dict) -> tuple[dict, dict]:
        import tensorrt_llm
        import torch

        if not torch.cuda.is_available():
            return {"ok": False, "error": f"tensorrt_llm {tensorrt_llm.__version__} imports but no CUDA GPU is visible"}, {}
        major, minor = torch.cuda.get_device_capability()
        return {"ok": True, "compute_capability": f"{major}.{minor}", "tensorrt_llm": tensorrt_llm.__version__}, {}

    def load(self, header: dict, arrays: dict) -> tuple[dict, dict]:
        from tensorrt_llm.runtime import ModelRunnerCpp

        engine = Path(header["engine_dir"])
        self.runner = ModelRunnerCpp.from_dir(str(engine),
                                              max_tokens_in_paged_kv_cache=header["max_tokens_in_paged_kv_cache"])
        # config.json as trtllm-build writes it: {"version", "pretrained_config", "build_config"}
        config = json.loads((engine / "config.json").read_text())
        pretrained = config["pretrained_config"]
        return {"ok": True, "vocab_size": pretrained["vocab_size"], "mrope": engine_mrope(pretrained),
                "max_batch_size": config["build_config"]["max_batch_size"]}, {}

    def generate(self, header: dict, arrays: dict) -> tuple[dict, dict]:
        """Prompts ids_0 .. ids_{n-1} (int32, image tokens already virtual ids) with one prompt table [n, rows,
        hidden], and for an M-RoPE engine each prompt's rotary cos/sin [n, max_positions * head_size] and rope delta
        [n, 1] (MropeParams, which ModelRunnerCpp hands each request as an executor MropeConfig); the new tokens of
        each prompt up to its sequence length."""
        import torch

        n = header["requests"]
        ids = [torch.from_numpy(arrays[f"ids_{i}"].astype("int32")) for i in range(n)]
        mrope = None
        if "mrope_cos_sin" in arrays:
            from tensorrt_llm.layers import MropeParams

            mrope = MropeParams(mrope_rotary_cos_sin=torch.from_numpy(arrays["mrope_cos_sin"].copy()),
                                mrope_position_deltas=torch.from_numpy(arrays["mrope_deltas"].copy()))
        started = time.perf_counter()
        out = self.runner.generate(
            ids, max_new_tokens=header["max_new_tokens"], end_id=header["end_id"], pad_id=header["pad_id"],
            stop_words_list=None, prompt_table=torch.from_numpy(arrays["table"].copy()),
            prompt_tasks=",".join(str(i) for i in range(n)), mrope_params=mrope, return_dict=True,
            output_sequence_lengths=True)
        seconds = time.perf_counter() - started
        tokens = {}
        for i in range(n):
            end = int(out["sequence_lengths"][i][0])
            tokens[f"tokens_{i}"] = out["output_ids"][i][0][len(ids[i]): end].cpu().numpy().astype("int32")
        return {"ok": True, "seconds": seconds}, tokens


def main() -> int:
    # run as a script, this file's folder leads sys.path: keep mmtrt's modules beside it out of the import path
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    try:
        import tensorrt_llm
    except Exception as exc:  # a broken install fails with more than ImportError
        write_message(protocol, {"ok": False, "error": f"tensorrt_llm is not importable in {sys.executable} "
                                                       f"({type(exc).__name__}: {exc})"})
        return 0
    write_message(protocol, {"ok": True, "tensorrt_llm": tensorrt_llm.__version__, "python": sys.executable})
    worker = Worker()
    while True:
        try:
            header, arrays = read_message(requests)
        except EOFError:
            return 0
        if header["op"] == "exit":
            return 0
        try:
            reply = getattr(worker, header["op"])(header, arrays)
        except Exception as exc:
            reply = {"ok": False, "error": f"{header['op']} failed: {type(exc).__name__}: {exc}"}, {}
        write_message(protocol, *reply)


if __name__ == "__main__":
    sys.exit(main())
