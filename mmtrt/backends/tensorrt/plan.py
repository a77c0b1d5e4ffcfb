"""The engine build plan the bundle carries: per TensorRT segment what `mmtrt build-engines` needs on the target.

Everything in the manifest is decided at compile time, on any host: the ONNX file (and the form TensorRT's parser
reads, `parser_form.py`), the optimization profiles (one per phase a segment runs in: an LLM segment gets `decode`,
seq = 1, and `prefill`, tuned for a typical prompt; shape-tensor inputs get value ranges), the precision (already
in the tensor types: TensorRT 11 and TensorRT-RTX networks are strongly typed, so TF32 stays off and an fp32 tensor
computes in fp32) and the plugins. What depends on the host (which engine file, the trtexec line) is rendered by
`build-engines --plan` for a resolved target, so every line it prints runs as printed.
"""

from __future__ import annotations

from typing import Any

from mmtrt.backends.tensorrt.engines import ENGINE_DIR, Target, engine_file, timing_cache_file
from mmtrt.backends.tensorrt.support import TABLE_SOURCE, TENSORRT_VERSION


def segment_entry(component: str, files: dict[str, Any], inputs: list[str], outputs: list[str],
                  profiles: list[dict] | None, unbuildable: str | None, precision: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": files["id"], "component": component, "onnx": files["onnx"],
        **({"tensorrt_onnx": files["tensorrt_onnx"]} if files.get("tensorrt_onnx") else {}),
        "files": files["files"], "sha256": files["sha256"], "inputs": inputs, "outputs": outputs, "profiles": profiles,
        "unbuildable": unbuildable, "precision": precision, "plugins": [],
        "build_command": f"mmtrt build-engines BUNDLE --segment {files['id']}",
    }


def trtexec_command(entry: dict[str, Any], target: Target) -> str:
    """The trtexec line that builds what `build-engines` builds for a TensorRT `target`, run in the bundle folder:
    the parser's form of the segment, the same profiles in the same order (a shape-tensor input's values where
    trtexec takes its shape), TF32 off, the timing cache and the engine under the names the runtime looks up."""
    parts = ["trtexec", f"--onnx={entry.get('tensorrt_onnx', entry['onnx'])}"]
    for index, profile in enumerate(entry["profiles"]):
        parts.append(f"--profile={index}")
        given = {**profile["shapes"], **profile.get("values", {})}
        for point in ("min", "opt", "max"):
            shapes = ",".join(f"{name}:{'x'.join(map(str, p[point]))}" for name, p in given.items())
            parts.append(f"--{point}Shapes={shapes}")
    parts += ["--noTF32", f"--timingCacheFile={timing_cache_file(target)}", f"--saveEngine={engine_file(entry, target)}",
              *[f"--dynamicPlugins={lib}" for lib in entry["plugins"]]]
    return " ".join(parts)


def build_plan(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"tensorrt_version": f"{TENSORRT_VERSION}.x", "operator_table": TABLE_SOURCE, "engine_dir": ENGINE_DIR,
            "segments": entries}
