"""ONNX Runtime runner: the backend every partition can fall back to, and the reference for every numeric claim."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from mmtrt.backends import _has_cuda_gpu
from mmtrt.backends.int8_gemm import exact_products, graph_ops


def session_options(threads: int | None, spin: bool, exact_int4: bool = False, ops=()) -> ort.SessionOptions:
    """`ops`: the op types of the session's graph, whose uint8 x int8 GEMMs are made exact on this host."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "1" if spin else "0")
    if exact_int4:
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    exact_products(opts, ops)
    return opts


class OrtRunner:
    """One ONNX Runtime session. `providers` is what the session actually got, not what was asked for."""

    def __init__(self, path: Path, threads: int | None = None, spin: bool = True):
        wanted = ["CPUExecutionProvider"]
        if _has_cuda_gpu() and "CUDAExecutionProvider" in ort.get_available_providers():
            wanted.insert(0, "CUDAExecutionProvider")
        options = session_options(threads, spin, ops=graph_ops(path))
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=wanted)
        self.providers = self.session.get_providers()
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.session.run(None, feeds)))
