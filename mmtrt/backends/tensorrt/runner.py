"""Runs a TensorRT engine through Polygraphy's TrtRunner (NOT RUN here: no TensorRT on these machines).

Polygraphy handles the execution context, shapes within the profile and device buffers; its output buffers are
reused between calls (TrtRunner.infer's documentation), so outputs are copied.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class EngineRunner:
    """Same interface as the ONNX Runtime runner: `run(feeds) -> outputs`, `providers`."""

    def __init__(self, path: Path, plugins: list[Path] = ()):
        import tensorrt as trt
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner

        for lib in plugins:
            trt.get_plugin_registry().load_library(str(lib))
        self.runner = TrtRunner(EngineFromBytes(Path(path).read_bytes()), name=Path(path).name)
        self.runner.activate()
        self.providers = ["TensorRT"]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: np.array(value, copy=True) for name, value in self.runner.infer(feeds).items()}
