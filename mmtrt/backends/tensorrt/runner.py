"""Runs a TensorRT or TensorRT-RTX engine through Polygraphy's TrtRunner (NOT RUN: no GPU on these machines).

Polygraphy handles the execution context, shapes within the profile and device buffers; its output buffers are
reused between calls (TrtRunner.infer's documentation), so outputs are copied. An engine built with several
optimization profiles (an LLM segment's decode and prefill) runs each call in the first profile, in the plan's
order, whose ranges hold the call's shapes (`TrtRunner.set_profile`, which calls the execution context's
`set_optimization_profile_async` on the runner's stream). An output the engine aliases to an input (the static KV
cache's `present.N.*`, written in place by IKVCacheUpdateLayer: `ICudaEngine.get_aliased_input_tensor`) is bound
at that input's device address by TrtRunner itself (polygraphy 0.53.6, backend/trt/runner.py `_infer_impl`), not
given a buffer of its own. Polygraphy drives TensorRT or TensorRT-RTX, one per process
(`polygraphy.config.USE_TENSORRT_RTX`, read when `polygraphy.backend.trt` is first imported).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mmtrt.errors import UserError


def choose_profile(profiles: list[dict[str, Any]], shapes: dict[str, tuple[int, ...]]) -> int:
    """The index of the first profile whose min/max hold every input shape."""
    for index, profile in enumerate(profiles):
        if all(all(lo <= d <= hi for d, lo, hi in zip(shapes[name], p["min"], p["max"]))
               for name, p in profile["shapes"].items() if name in shapes):
            return index
    names = ", ".join(p["name"] for p in profiles)
    raise UserError(f"input shapes {shapes} fit none of the engine's profiles ({names}); recompile the bundle "
                    "with a wider envelope")


def use_flavor(flavor: str) -> None:
    """Point Polygraphy's TensorRT backend at `flavor`'s module before it is imported; refuse a second flavor."""
    import sys

    from polygraphy import config

    wanted = flavor == "rtx"
    if "polygraphy.backend.trt" in sys.modules and config.USE_TENSORRT_RTX != wanted:
        raise UserError(f"this process already runs {'TensorRT-RTX' if config.USE_TENSORRT_RTX else 'TensorRT'} "
                        f"engines and Polygraphy drives one of the two per process; load {flavor} engines in "
                        "another process")
    config.USE_TENSORRT_RTX = wanted


def trt_runner(path: Path, profiles: list[dict[str, Any]] | None, name: str, flavor: str = "tensorrt"):
    """Polygraphy's TrtRunner for the engine at `path`, switching to the profile that holds each call's shapes
    (for Polygraphy's Comparator as for the runtime)."""
    use_flavor(flavor)
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    class ProfileSelectingTrtRunner(TrtRunner):
        active = 0

        def infer_impl(self, feed_dict, *args, **kwargs):
            if profiles and len(profiles) > 1:
                index = choose_profile(profiles, {k: tuple(v.shape) for k, v in feed_dict.items()})
                if index != self.active:
                    self.set_profile(index)
                    self.active = index
            return super().infer_impl(feed_dict, *args, **kwargs)

    return ProfileSelectingTrtRunner(EngineFromBytes(Path(path).read_bytes()), name=name)


class EngineRunner:
    """Same interface as the ONNX Runtime runner: `run(feeds) -> outputs`, `providers`."""

    def __init__(self, path: Path, profiles: list[dict[str, Any]] | None = None, plugins: list[Path] = (),
                 flavor: str = "tensorrt"):
        import importlib

        trt = importlib.import_module("tensorrt_rtx" if flavor == "rtx" else "tensorrt")
        for lib in plugins:
            trt.get_plugin_registry().load_library(str(lib))
        self.runner = trt_runner(path, profiles, Path(path).name, flavor)
        self.runner.activate()
        self.providers = ["TensorRT-RTX" if flavor == "rtx" else "TensorRT"]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: np.array(value, copy=True) for name, value in self.runner.infer(feeds).items()}
