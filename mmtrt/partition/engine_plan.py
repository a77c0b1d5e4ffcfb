"""What the compiler writes for TensorRT hosts: placement per component, segment files, the engine build plan,
the TensorRT-LLM checkpoint (of a float LLM) and command, and Polygraphy's data loaders. All of it is decided here, on any host; `mmtrt build-engines` executes it.

An engine is tuned at its profile's opt shape, so one profile cannot serve both LLM phases well: a segment whose
inputs depend on the sequence gets a `decode` profile (seq = 1 after a typical prompt, the shape it runs most)
and a `prefill` profile (a typical prompt, no past); any other segment gets one profile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmtrt.backends.tensorrt.kv_cache_form import FORMS, has_gqa, tensorrt_form
from mmtrt.backends.tensorrt.plan import build_plan, segment_entry
from mmtrt.bundle.stored import StoredTensors
from mmtrt.handoff.trtllm_plan import CHECKPOINT_DIR, trtllm_plan
from mmtrt.ir.graph import ModelIR
from mmtrt.kernels.bundle import write_plugins
from mmtrt.partition import segments
from mmtrt.partition.placement import TENSORRT, place_component
from mmtrt.partition.polygraphy_inputs import write_loaders
from mmtrt.handoff.trtllm_export import NotExportable, float_checkpoint_assets
from mmtrt.recipe import Recipe

FLOAT_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def engine_sections(ir: ModelIR, recipe: Recipe, dims: dict, folder: Path, files: dict[str, Any],
                    stored: StoredTensors) -> dict[str, Any]:
    """The manifest's `placement`, `tensorrt` and `tensorrt_llm` sections; writes segment files into `folder`, which
    read the tensors already saved there (`stored`: the components') rather than copy them."""
    placements, entries, plugins = {}, [], []
    threshold = recipe.output.external_data_threshold
    typical = recipe.envelope.prompt_tokens.opt + ir.config["vision"]["image_tokens"]
    speculative = ir.config.get("speculative") or {}
    phases = phase_dims(dims, typical, speculative.get("k"))
    draft, draft_phases = speculative.get("component"), {"decode": phases["decode"]}  # a draft proposes one at a time
    for comp in ir.onnx_components():
        placement, forms = _placement(comp, dims)
        written = segments.write(placement, folder, threshold, None if forms else files[comp.name], stored)
        report = {**placement.to_json(), **({"kv_cache_forms": forms} if forms else {})}
        for seg_json, seg_files in zip(report["segments"], written):
            seg_json.update(onnx=seg_files["onnx"], files=seg_files["files"])
        placements[comp.name] = report
        for s, seg_files in zip(placement.segments, written):
            if s.backend == TENSORRT:
                profiles, why = segment_profiles(placement, s, draft_phases if comp.name == draft else phases)
                entries.append(segment_entry(comp.name, seg_files, s.inputs, s.outputs, profiles, why,
                                             segments.precision(placement, s)))
                _add_plugins(entries[-1], placement.plugins(s))
                plugins += placement.plugins(s)
    llm_plan = None
    if "tensorrt-llm" in recipe.partition.llm:
        why_not = write_float_checkpoint(ir, recipe, folder)
        llm_plan = trtllm_plan(ir.config, dims, (folder / CHECKPOINT_DIR / "config.json").is_file(), why_not)
    plan = build_plan(entries)
    plan["plugins"] = write_plugins(folder, plugins)
    contracts = {c.name: {**files[c.name], "inputs": [s.to_json() for s in c.inputs]} for c in ir.onnx_components()}
    loaders = write_loaders(contracts, dims, typical, ir.config["llm"]["vocab_size"], folder)
    return {"placement": placements, "tensorrt": plan, "tensorrt_llm": llm_plan, "polygraphy": loaders}


def _placement(comp, dims: dict):
    """The component's placement; a static KV cache's LLM is placed in the form TensorRT parses (its segments are
    cut from that form), with what runs where."""
    settings = comp.metadata.get("placement", {})
    if comp.name != "llm" or not settings.get("targeted") or not has_gqa(comp.onnx):
        return place_component(comp), None
    return place_component(comp, tensorrt_form(comp.onnx, dims)), FORMS


def write_float_checkpoint(ir: ModelIR, recipe: Recipe, folder: Path) -> str | None:
    """Write the float LLM's TensorRT-LLM checkpoint into `folder` unless a quantization pass wrote one; in
    cast_precision's dtype when the recipe runs it, else float16 (TensorRT-LLM's 16-bit GEMMs). None, or why not."""
    if (folder / CHECKPOINT_DIR / "config.json").is_file():
        return None
    if ir.config["llm"].get("trtllm_refused"):  # a family whose LLM the checkpoint writer does not cover
        return ir.config["llm"]["trtllm_refused"]
    cast = dict(recipe.pass_list()).get("cast_precision")
    dtype = FLOAT_DTYPES[(cast or {}).get("dtype", "fp16")]
    try:
        assets = float_checkpoint_assets(ir, dtype)
    except NotExportable as exc:
        return str(exc)
    for rel, content in assets.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(content)
    return None


def _add_plugins(entry: dict[str, Any], plugin_ids: list[str]) -> None:
    """The mmtrt plugins a segment calls (manifest tensorrt.plugins has their files); trtexec cannot register
    tensorrt.plugin (Python) plugins, so such a segment is built with `mmtrt build-engines`."""
    entry["aot_plugins"] = plugin_ids
    if plugin_ids and entry["profiles"] is not None:
        entry["trtexec_note"] = (f"needs {', '.join(plugin_ids)} registered through tensorrt.plugin, which trtexec "
                                 f"cannot load: use {entry['build_command']}")


def phase_dims(dims: dict[str, dict[str, int]], typical_prompt: int,
               draft_tokens: int | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """The shape plan as each LLM phase sees it. Decode: seq is 1, the cache holds a typical prompt (the plan's
    own opt points). Prefill: seq up to its planned maximum, tuned for a typical prompt (text plus image tokens)
    with no past; the past stays allowed (a follow-up turn) over its planned range. Verify, where a speculative
    pass names `draft_tokens` (k): the last token and the k drafted after it, on a typical cache."""
    seq, past = dims["seq"], dims["past"]
    typical = min(max(typical_prompt, seq["min"]), seq["max"])
    decode = {**dims, "seq": {"min": 1, "opt": 1, "max": 1}}
    tokens = {"min": 1, "opt": typical, "max": dims["total"]["max"]}
    prefill = {**dims, "seq": {**seq, "opt": typical}, "past": {**past, "opt": 0}, "total": tokens,
               "past + seq": tokens}
    if not draft_tokens:
        return {"decode": decode, "prefill": prefill}
    width = min(draft_tokens + 1, seq["max"])
    after = {**dims["total"], "opt": min(past["opt"] + width, dims["total"]["max"])}
    verify = {**decode, "seq": {"min": 1, "opt": width, "max": width}, "total": after, "past + seq": after}
    return {"decode": decode, "verify": verify, "prefill": prefill}


def segment_profiles(placement, segment, phases) -> tuple[list[dict] | None, str | None]:
    """Per phase a profile for the segment's inputs, or (None, why) when a dimension is not planned; one
    profile when the phases give the same shapes (a segment that does not read the sequence)."""
    profiles = []
    for name, dims in phases.items():
        shapes, why = segments.profile(placement, segment, dims)
        if shapes is None:
            return None, why
        values = segments.shape_values(segment, dims)
        if all((shapes, values) != (p["shapes"], p.get("values", {})) for p in profiles):
            profiles.append({"name": name, "shapes": shapes, **({"values": values} if values else {})})
    if len(profiles) == 1:
        profiles[0]["name"] = "all"
    return profiles, None
