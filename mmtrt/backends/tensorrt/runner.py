"""Runs a TensorRT engine through Polygraphy's TrtRunner (NOT RUN here: no TensorRT on these machines).

Polygraphy handles the execution context, shapes within the profile and device buffers; its output buffers are
reused between calls (TrtRunner.infer's documentation), so outputs are copied. An engine built with several
optimization profiles (an LLM segment's decode and prefill) runs each call in the first profile, in the plan's
order, whose ranges hold the call's shapes (`TrtRunner.set_profile`, which calls the execution context's
`set_optimization_profile_async` on the runner's stream).
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


def trt_runner(path: Path, profiles: list[dict[str, Any]] | None, name: str):
    """Polygraphy's TrtRunner for the engine at `path`, switching to the profile that holds each call's shapes
    (for Polygraphy's Comparator as for the runtime)."""
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

    def __init__(self, path: Path, profiles: list[dict[str, Any]] | None = None, plugins: list[Path] = ()):
        import tensorrt as trt

        for lib in plugins:
            trt.get_plugin_registry().load_library(str(lib))
        self.runner = trt_runner(path, profiles, Path(path).name)
        self.runner.activate()
        self.providers = ["TensorRT"]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: np.array(value, copy=True) for name, value in self.runner.infer(feeds).items()}
