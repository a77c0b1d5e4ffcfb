"""What this host runs of a bundle, decided at load time: the bundle's plan is for the target, this is the host.

A TensorRT segment runs as an engine when one matches this host (`executors.engine_choices`), the LLM through
TensorRT-LLM when its engine does (`executors.llm_engine_choice`); everything else runs on ONNX Runtime, whatever
the recipe preferred, since the bundle always carries the ONNX.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmtrt.backends import unavailable_reason
from mmtrt.preprocess.numpy_transform import covers
from mmtrt.runtime.executors import engine_choices, llm_engine_choice


def host_backends(bundle: Path, manifest: dict[str, Any], choices: dict | None = None) -> dict[str, str]:
    """Per component: the backend(s) this host runs it on, and why where that is not the plan."""
    choices = engine_choices(Path(bundle), manifest) if choices is None else choices
    report = {}
    for comp, partition in manifest["partitions"].items():
        if comp == "preprocess":
            report[comp] = _preprocess_backend(Path(bundle), manifest)
            continue
        segments = [s["id"] for s in manifest.get("placement", {}).get(comp, {}).get("segments", [])]
        planned = {seg: choices[seg] for seg in segments if seg in choices}
        engines = [seg for seg, (engine, _) in planned.items() if engine is not None]
        reasons = sorted({why for engine, why in planned.values() if engine is None})
        if partition.get("planned") == "tensorrt-llm":
            engine, why = llm_engine_choice(Path(bundle), manifest)
            if engine is not None:
                report[comp] = f"tensorrt-llm ({why})"
                continue
            reasons.append(f"tensorrt-llm: {why}")
        if engines and len(engines) == len(segments):
            report[comp] = f"tensorrt ({', '.join(engines)})"
        elif engines:
            report[comp] = f"tensorrt ({', '.join(engines)}) + onnxruntime (the other segments: {'; '.join(reasons)})"
        else:
            report[comp] = "onnxruntime" + (f" ({'; '.join(reasons)})" if reasons else "")
    return report


def _preprocess_backend(bundle: Path, manifest: dict[str, Any]) -> str:
    """numpy runs every spec the compiler writes today; TorchVision (imported only then) any other."""
    if covers(json.loads((bundle / manifest["components"]["preprocess"]["artifact"]).read_text())):
        return "numpy"
    why = unavailable_reason("torchvision")
    return "torchvision" if why is None else f"none: {why}"
