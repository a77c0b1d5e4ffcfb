"""What the compiler writes for TensorRT hosts: placement per component, segment files, the engine build plan
and the TensorRT-LLM command. All of it is decided here, on any host; `mmtrt build-engines` executes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmtrt.backends.tensorrt.plan import build_plan, segment_entry
from mmtrt.backends.tensorrt_llm import CHECKPOINT_DIR, trtllm_plan
from mmtrt.ir.graph import ModelIR
from mmtrt.kernels.bundle import write_plugins
from mmtrt.partition import segments
from mmtrt.partition.placement import TENSORRT, place_component
from mmtrt.recipe import Recipe


def engine_sections(ir: ModelIR, recipe: Recipe, dims: dict, folder: Path, files: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `placement`, `tensorrt` and `tensorrt_llm` sections; writes segment files into `folder`."""
    placements, entries, plugins = {}, [], []
    threshold = recipe.output.external_data_threshold
    for comp in ir.onnx_components():
        placement = place_component(comp)
        written = segments.write(placement, folder, threshold, files[comp.name])
        report = placement.to_json()
        for seg_json, seg_files in zip(report["segments"], written):
            seg_json.update(onnx=seg_files["onnx"], files=seg_files["files"])
        placements[comp.name] = report
        for s, seg_files in zip(placement.segments, written):
            if s.backend == TENSORRT:
                profile, why = segments.profile(placement, s, dims)
                entries.append(segment_entry(comp.name, seg_files, s.inputs, s.outputs, profile, why,
                                             segments.precision(placement, s)))
                _add_plugins(entries[-1], placement.plugins(s))
                plugins += placement.plugins(s)
    llm_plan = None
    if "tensorrt-llm" in recipe.partition.llm:
        llm_plan = trtllm_plan(ir.config, dims, (folder / CHECKPOINT_DIR / "config.json").is_file())
    plan = build_plan(entries)
    plan["plugins"] = write_plugins(folder, plugins)
    return {"placement": placements, "tensorrt": plan, "tensorrt_llm": llm_plan}


def _add_plugins(entry: dict[str, Any], plugin_ids: list[str]) -> None:
    """The mmtrt plugins a segment calls (manifest tensorrt.plugins has their files); trtexec cannot register
    tensorrt.plugin (Python) plugins, so such a segment is built with `mmtrt build-engines`."""
    entry["aot_plugins"] = plugin_ids
    if plugin_ids and entry.get("trtexec"):
        entry["trtexec_note"] = (f"needs {', '.join(plugin_ids)} registered through tensorrt.plugin, which trtexec "
                                 f"cannot load: use {entry['build_command']}")
