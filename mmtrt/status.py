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
    Row("ONNX Runtime's CUDA provider, chosen when a CUDA GPU is visible and onnxruntime-gpu is installed; the "
        "static KV cache in GPU memory", "ONNX Runtime, CUDA", NEVER_RUN + ": no GPU here, and the lent GPU's image "
        "has the CPU onnxruntime only", ("mmtrt/backends/onnxruntime_backend.py", "scripts/gpu_backend_check.py")),
    Row("`mmtrt serve`: Triton and an OpenAI-compatible endpoint on one continuous-batching loop; `mmtrt export` "
        "to a Triton model repository", "Triton Inference Server (PyTriton), FastAPI; ONNX Runtime, CPU", TESTED,
        ("tests/serve",)),
    Row("`mmtrt eval`, `compare`, `profile`, `inspect`, `verify`, `sign`, `nightly`", "ONNX Runtime, CPU", TESTED,
        ("tests/eval", "tests/compare", "tests/profile", "tests/bundle", "tests/bundle/test_sign.py",
         "tests/nightly")),
    Row("C++ runtime (`mmtrt-run`, `libmmtrt`, C API): LLaVA 1.5-style bundles (it refuses the others)",
        "ONNX Runtime C API, CPU", TESTED + ": tokens equal the Python runtime's", ("tests/runtime/cpp",)),
    Row("`mmtrt build-engines --target rtx`: every TensorRT segment built on any host", "TensorRT-RTX 1.7: engines for GPUs of compute capability 8.0, "
        "8.6, 8.9 and 12.0, none for Hopper (H100, H200)",
        "builds here on the CPU with the real builder, tested; no engine has run (no GPU)",
        ("tests/backends/test_rtx_build.py",)),
    Row("`mmtrt build-engines` and the engine runner", "TensorRT 11", NEVER_RUN + ": TensorRT 11 does not install here",
        ("mmtrt/backends/tensorrt",)),
    Row("`mmtrt export hf`: the compiled LLM (float, or AWQ INT4 in AutoAWQ's packing) with the vision tower, as a "
        "Hugging Face folder in the Hub's key layout", "transformers, CPU",
        TESTED + ": tokens equal the bundle's (INT4: the weights exactly, dequantized)", ("tests/handoff/test_hf_export.py",)),
    Row("TensorRT-LLM's LLM API: `mmtrt export hf --format modelopt` (AWQ INT4 as ModelOpt's W4A16_AWQ) and a runner "
        "feeding `tensorrt_llm.LLM` the bundle's image embeddings in its own environment", "TensorRT-LLM (PyTorch "
        "backend)", "export tested against the format; runner written against the sources, " + NEVER_RUN,
        ("tests/handoff/test_modelopt_export.py", "tests/handoff/test_trtllm_llmapi.py",
         "mmtrt/handoff/trtllm_llmapi_worker.py")),
    Row("the LLM's engine, opt-in (`partition.llm` lists `tensorrt-llm`): checkpoint, `trtllm-build`, runner in its "
        "own environment; TensorRT-LLM 1.2 or older", "TensorRT-LLM",
        "checkpoint tested against numpy; build and runner " + NEVER_RUN,
        ("tests/handoff/test_trtllm_engines.py", "mmtrt/handoff/trtllm_worker.py")),
    Row("custom plugins (TokenSelect, TokenSelectMerge, TokenSelectScored, TokenSelectDynamic, Int4GroupGemm)",
        "CUDA; TensorRT 11 (AOT plugins: the kernel in the engine), TensorRT-RTX (Python IPluginV3 plugins that "
        "launch the bundle's PTX through CuPy; the engine records only their names, versions and fields)",
        "compiled by nvcc, CPU twins tested, registered into TensorRT-RTX engines built here, TensorRT 11 "
        "registration checked against TensorRT 11.4's validators; never run on a GPU",
        ("tests/kernels", "tests/kernels/test_rtx_plugins.py", "tests/kernels/test_registration.py",
         "mmtrt/kernels/csrc")),
    Row("the GPU check (`scripts/gpu_check.sh`): the plugin kernels against their CPU twins, compute-sanitizer, "
        "Nsight Compute against the roofline, the compile's CUDA path", "CUDA, CuPy on an H200",
        "its dry run tested here (payload, imports, parsing); never run on a GPU",
        ("tests/test_gpu_check.py", "scripts/gpu_check.py")),
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
