"""The engine build plan the bundle carries: per TensorRT segment what `mmtrt build-engines` needs on the target.

Everything here is decided at compile time, on any host: the ONNX file, the optimization profiles (one per
phase a segment runs in: an LLM segment gets `decode`, seq = 1, and `prefill`, tuned for a typical prompt), the
precision (already in the tensor types: TensorRT 11 networks are strongly typed, so TF32 stays off and an fp32
tensor computes in fp32), the plugin libraries and the commands.
"""

from __future__ import annotations

from typing import Any

from mmtrt.backends.tensorrt.engines import ENGINE_DIR, engine_name
from mmtrt.backends.tensorrt.support import TABLE_SOURCE, TENSORRT_VERSION

TARGET_PLACEHOLDER = "{target}"


def segment_entry(component: str, files: dict[str, Any], inputs: list[str], outputs: list[str],
                  profiles: list[dict] | None, unbuildable: str | None, precision: dict[str, Any]) -> dict[str, Any]:
    entry = {
        "id": files["id"], "component": component, "onnx": files["onnx"], "files": files["files"],
        "sha256": files["sha256"], "inputs": inputs, "outputs": outputs, "profiles": profiles,
        "unbuildable": unbuildable, "precision": precision, "plugins": [],
        "build_command": f"mmtrt build-engines BUNDLE --segment {files['id']}",
    }
    entry["trtexec"] = trtexec_command(entry) if profiles is not None else None
    return entry


def trtexec_command(entry: dict[str, Any]) -> str:
    """The equivalent trtexec line, run in the bundle folder with {target} replaced by sm<cc>-trt<version>
    (`Target.tag()`): it writes the engine under the name the runtime looks for, with the same profiles, in the
    same order, and TF32 off as `build-engines` builds it."""
    parts = ["trtexec", f"--onnx={entry['onnx']}"]
    for index, profile in enumerate(entry["profiles"]):
        parts.append(f"--profile={index}")
        for point in ("min", "opt", "max"):
            shapes = ",".join(f"{name}:{'x'.join(map(str, p[point]))}" for name, p in profile["shapes"].items())
            parts.append(f"--{point}Shapes={shapes}")
    parts += [
        "--noTF32",
        f"--timingCacheFile={ENGINE_DIR}/timing-{TARGET_PLACEHOLDER}.cache",
        f"--saveEngine={engine_name(entry, TARGET_PLACEHOLDER)}",
        *[f"--dynamicPlugins={lib}" for lib in entry["plugins"]],
    ]
    return " ".join(parts)


def build_plan(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"tensorrt_version": f"{TENSORRT_VERSION}.x", "operator_table": TABLE_SOURCE, "engine_dir": ENGINE_DIR,
            "segments": entries}
