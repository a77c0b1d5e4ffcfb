"""What the compiler writes for TensorRT hosts: placement per component, segment files, the engine build plan
and the TensorRT-LLM command. All of it is decided here, on any host; `mmtrt build-engines` executes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmtrt.backends.tensorrt.plan import build_plan, segment_entry
from mmtrt.backends.tensorrt_llm import CHECKPOINT_DIR, trtllm_plan
from mmtrt.ir.graph import ModelIR
from mmtrt.partition import segments
from mmtrt.partition.placement import TENSORRT, place_component
from mmtrt.recipe import Recipe


def engine_sections(ir: ModelIR, recipe: Recipe, dims: dict, folder: Path, files: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `placement`, `tensorrt` and `tensorrt_llm` sections; writes segment files into `folder`."""
    placements, entries = {}, []
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
    llm_plan = None
    if "tensorrt-llm" in recipe.partition.llm:
        llm_plan = trtllm_plan(ir.config, dims, (folder / CHECKPOINT_DIR / "config.json").is_file())
    return {"placement": placements, "tensorrt": build_plan(entries), "tensorrt_llm": llm_plan}
