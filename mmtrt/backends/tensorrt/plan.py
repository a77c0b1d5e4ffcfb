"""The engine build plan the bundle carries: per TensorRT segment what `mmtrt build-engines` needs on the target.

Everything here is decided at compile time, on any host: the ONNX file, the optimization profile, the precision
(already in the tensor types: TensorRT 11 networks are strongly typed), the plugin libraries and the commands.
"""

from __future__ import annotations

from typing import Any

from mmtrt.backends.tensorrt.engines import ENGINE_DIR
from mmtrt.backends.tensorrt.support import TABLE_SOURCE, TENSORRT_VERSION

TARGET_PLACEHOLDER = "{target}"


def segment_entry(component: str, files: dict[str, Any], inputs: list[str], outputs: list[str],
                  profile: dict | None, unbuildable: str | None, precision: dict[str, Any]) -> dict[str, Any]:
    entry = {
        "id": files["id"], "component": component, "onnx": files["onnx"], "files": files["files"],
        "sha256": files["sha256"], "inputs": inputs, "outputs": outputs, "profile": profile,
        "unbuildable": unbuildable, "precision": precision, "plugins": [],
        "build_command": f"mmtrt build-engines BUNDLE --segment {files['id']}",
    }
    entry["trtexec"] = trtexec_command(entry) if profile is not None else None
    return entry


def trtexec_command(entry: dict[str, Any]) -> str:
    """The equivalent trtexec line, run in the bundle folder with {target} replaced by sm<cc>-trt<version>."""
    shapes = {point: ",".join(f"{name}:{'x'.join(map(str, p[point]))}" for name, p in entry["profile"].items())
              for point in ("min", "opt", "max")}
    parts = [
        "trtexec", f"--onnx={entry['onnx']}",
        f"--minShapes={shapes['min']}", f"--optShapes={shapes['opt']}", f"--maxShapes={shapes['max']}",
        f"--timingCacheFile={ENGINE_DIR}/timing-{TARGET_PLACEHOLDER}.cache",
        f"--saveEngine={ENGINE_DIR}/{entry['id']}-{TARGET_PLACEHOLDER}.engine",
        *[f"--dynamicPlugins={lib}" for lib in entry["plugins"]],
    ]
    return " ".join(parts)


def build_plan(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"tensorrt_version": f"{TENSORRT_VERSION}.x", "operator_table": TABLE_SOURCE, "engine_dir": ENGINE_DIR,
            "segments": entries}
