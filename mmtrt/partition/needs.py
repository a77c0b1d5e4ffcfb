"""What a partition's planned backend needs, and on which host: the one line `compile --plan` and `inspect` print
per partition, so a reader learns what to install where without a paragraph of import errors (those stay in
`inspect --json`'s `this_host`)."""

from __future__ import annotations

NEEDS = {
    "torchvision": "any host (numpy runs the specs the compiler writes)",
    "onnxruntime": "any host (CPU or CUDA)",
    "tensorrt": ("a CUDA GPU: TensorRT 11 and an engine built there, or a TensorRT-RTX engine built anywhere "
                 "(mmtrt build-engines BUNDLE [--target rtx]); elsewhere ONNX Runtime"),
    "tensorrt-llm": ("a CUDA GPU: TensorRT-LLM 1.2 or older in its own environment (MMTRT_TRTLLM_PYTHON) and its "
                     "engine built there (mmtrt build-engines BUNDLE); elsewhere ONNX Runtime"),
}


def needs(backend: str) -> str:
    return NEEDS[backend]


def host_line(planned: str, this_host: str) -> str:
    """`this host: X`, the backend this host runs without the reasons; what the plan needs when that differs."""
    runs = this_host.split(" (", 1)[0]
    if runs == planned or planned in ("torchvision", "onnxruntime"):
        return f"this host: {runs}"
    return f"this host: {runs}; {planned} needs {needs(planned)}"
