"""What runs and is tested on a CPU host, and what is written but has never run. The README's status matrix is
generated from this table by `make docs`; a test checks that every command is in a row and that each row's
evidence (the tests that hold it, or the code that was never run) exists. Change a row here when that changes."""

from __future__ import annotations

from dataclasses import dataclass

TESTED = "runs, tested here"
NEVER_RUN = "written, never run"


@dataclass(frozen=True)
class Row:
    what: str
    backend: str
    state: str
    evidence: tuple[str, ...]  # test folders or files for what is tested; the source for what never ran


ROWS = (
    Row("`mmtrt compile`: LLaVA 1.5, LLaVA-NeXT, LLaVA-OneVision, Qwen2-VL and Qwen2.5-VL lowered, {passes} "
        "passes, backend and shape plans, the bundle", "PyTorch export to ONNX, CPU",
        TESTED, ("tests/passes", "tests/ir", "tests/partition", "tests/bundle")),
    Row("`mmtrt run`, `mmtrt.runtime.load`: greedy decoding and sampling, streaming, chat messages, batches, KV "
        "layouts, prefix reuse", "ONNX Runtime, CPU",
        TESTED + ": tokens equal transformers' `generate`", ("tests/runtime/test_parity.py", "tests/runtime")),
    Row("`mmtrt serve`: Triton and an OpenAI-compatible endpoint on one continuous-batching loop; `mmtrt export` "
        "to a Triton model repository", "Triton Inference Server (PyTriton), FastAPI; ONNX Runtime, CPU", TESTED,
        ("tests/serve",)),
    Row("`mmtrt eval`, `compare`, `profile`, `inspect`, `verify`, `sign`, `nightly`", "ONNX Runtime, CPU", TESTED,
        ("tests/eval", "tests/compare", "tests/profile", "tests/bundle", "tests/bundle/test_sign.py",
         "tests/nightly")),
    Row("C++ runtime (`mmtrt-run`, `libmmtrt`, C API): LLaVA 1.5-style bundles (it refuses the others)",
        "ONNX Runtime C API, CPU", TESTED + ": tokens equal the Python runtime's", ("tests/runtime/cpp",)),
    Row("`mmtrt build-engines --target rtx`: every TensorRT segment built on any host", "TensorRT-RTX 1.7",
        "builds here on the CPU with the real builder, tested; no engine has run (no GPU)",
        ("tests/backends/test_rtx_build.py",)),
    Row("`mmtrt build-engines` and the engine runner", "TensorRT 11", NEVER_RUN + ": TensorRT 11 does not install here",
        ("mmtrt/backends/tensorrt",)),
    Row("`mmtrt export hf`: the compiled LLM (float, or AWQ INT4 in AutoAWQ's packing) with the vision tower, as a "
        "Hugging Face folder in the Hub's key layout", "transformers, CPU",
        TESTED + ": tokens equal the bundle's (INT4: the weights exactly, dequantized)", ("tests/handoff/test_hf_export.py",)),
    Row("the LLM's engine, opt-in (`partition.llm` lists `tensorrt-llm`): checkpoint, `trtllm-build`, runner in its "
        "own environment; TensorRT-LLM 1.2 or older", "TensorRT-LLM",
        "checkpoint tested against numpy; build and runner " + NEVER_RUN,
        ("tests/handoff/test_trtllm_engines.py", "mmtrt/handoff/trtllm_worker.py")),
    Row("custom plugins (TokenSelect, Int4GroupGemm)", "CUDA; TensorRT 11, TensorRT-RTX",
        "compiled by nvcc and built into TensorRT-RTX engines, CPU twins tested; never run on a GPU",
        ("tests/kernels", "tests/kernels/test_rtx_plugins.py", "mmtrt/kernels/csrc")),
    Row("the C++ runtime's TensorRT path", "TensorRT 11", "written, never compiled",
        ("mmtrt/runtime/cpp/src/trt_runner.cpp",)),
    Row("nightly GPU jobs and Docker images", "GitHub Actions, Docker", "linted, never run or built",
        (".github/workflows/nightly.yml", "docker")),
)


def matrix(passes: int) -> str:
    """The README's table."""
    lines = ["| what | backend | status |", "| --- | --- | --- |"]
    lines += [f"| {row.what.format(passes=passes)} | {row.backend} | {row.state} |" for row in ROWS]
    return "\n".join(lines)
