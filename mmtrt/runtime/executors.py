"""Which runner executes each component on this host.

A TensorRT segment runs as an engine when engines/index.json holds one whose key matches this host (segment
digest, profile, compute capability, TensorRT version; or a TensorRT-RTX engine built for this GPU's compute
capability with the TensorRT-RTX installed here); otherwise ONNX Runtime runs it and the reason is kept. One
process runs engines of one of the two (Polygraphy drives one), so a load takes the one with more engines here.
A component without any usable engine runs whole on ONNX Runtime; a split component with some runs segment by
segment, passing the boundary tensors by name. The LLM runs through TensorRT-LLM instead when the bundle plans it
and engines/index.json holds an engine for its checkpoint, build options and this host (`llm_engine_choice`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mmtrt.backends.onnxruntime_backend import OrtRunner
from mmtrt.backends.tensorrt.engines import probe_target, read_index, select
from mmtrt.backends.tensorrt.flavors import RTX, TENSORRT
from mmtrt.handoff.trtllm_engines import SEGMENT as TRTLLM, bundle_reason, probe_llm_target, select_llm_engine


class SegmentChain:
    """Runs segments in order; each reads its inputs from the tensors computed so far."""

    def __init__(self, steps: list[tuple[Any, list[str]]], outputs: list[str]):
        self.steps = steps
        self.outputs = outputs
        self.providers = list(dict.fromkeys(p for runner, _ in steps for p in runner.providers))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = dict(feeds)
        for runner, inputs in self.steps:
            tensors.update(runner.run({name: tensors[name] for name in inputs}))
        return {name: tensors[name] for name in self.outputs}


def engine_choices(bundle: Path, manifest: dict[str, Any]) -> dict[str, tuple[Path | None, str]]:
    """Per TensorRT segment of the plan: the engine to use, or None and why not."""
    entries = (manifest.get("tensorrt") or {}).get("segments", [])
    if not entries:
        return {}
    index = read_index(bundle)
    found = {TENSORRT.name: {e["id"]: select(bundle, e, probe_target(TENSORRT), index) for e in entries}}
    if any(r.get("flavor") == RTX.name for r in index.values()):  # importing tensorrt_rtx costs a second
        rtx = probe_target(RTX)
        found[RTX.name] = _plugins_runnable(bundle, manifest, entries,
                                            {e["id"]: _rtx_choice(bundle, e, rtx, index) for e in entries})
    else:
        found[RTX.name] = {e["id"]: (None, "no TensorRT-RTX engine in this bundle (mmtrt build-engines BUNDLE "
                                           "--target rtx builds them on any host)") for e in entries}
    best = max(found, key=lambda name: sum(engine is not None for engine, _ in found[name].values()))
    other = RTX.name if best == TENSORRT.name else TENSORRT.name
    return {seg: (engine, why) if engine is not None else (None, f"{why}; {other}: {found[other][seg][1]}")
            for seg, (engine, why) in found[best].items()}


def _rtx_choice(bundle: Path, entry: dict, target, index: dict) -> tuple[Path | None, str]:
    """select(), saying which built TensorRT-RTX engine stays unused when this host cannot run it."""
    built = sorted(r["file"] for r in index.values() if r["segment"] == entry["id"] and r.get("flavor") == RTX.name)
    if isinstance(target, str) and built:
        return None, f"TensorRT-RTX engine {built[0]} not loaded: {target}"
    return select(bundle, entry, target, index)


def _plugins_runnable(bundle: Path, manifest: dict[str, Any], entries: list[dict], choices: dict) -> dict:
    """The choices, with each TensorRT-RTX engine that calls mmtrt's plugins given up, with the reason, where its
    plugins cannot run here (mmtrt.kernels.rtx.runtime_reason): ONNX Runtime runs that segment."""
    users = [e for e in entries if e.get("aot_plugins") and choices[e["id"]][0] is not None]
    if not users:
        return choices
    from mmtrt.kernels.rtx import runtime_reason

    why = runtime_reason(bundle, manifest["tensorrt"]["plugins"])
    if why is None:
        return choices
    return {**choices, **{e["id"]: (None, f"TensorRT-RTX engine {Path(choices[e['id']][0]).name} not loaded: its "
                                          f"plugins ({', '.join(e['aot_plugins'])}) cannot run here: {why}")
                          for e in users}}


def _register_rtx_plugins(bundle: Path, manifest: dict[str, Any], entries: list[dict]) -> None:
    """A TensorRT-RTX engine records mmtrt's plugins, not their kernels: their creators must be registered before
    it loads (TensorRT 11's AOT plugins carry the kernel in the engine and need nothing)."""
    if any(e.get("aot_plugins") for e in entries):
        import tensorrt_rtx

        from mmtrt.kernels.bundle import register_plugins

        register_plugins(bundle, manifest["tensorrt"]["plugins"], tensorrt_rtx, parsing=False)


def engine_flavor(path: Path) -> str:
    """Which TensorRT built an engine: its file name carries the target's tag (`engines.Target.tag`)."""
    return RTX.name if "-rtx" in Path(path).name else TENSORRT.name


def llm_engine_choice(bundle: Path, manifest: dict[str, Any]) -> tuple[Path | None, str | None]:
    """The TensorRT-LLM engine folder for the LLM, or None and why not (None, None: the bundle does not plan one)."""
    if not manifest.get("tensorrt_llm"):
        return None, None
    why = bundle_reason(manifest)  # before probing, which imports tensorrt_llm
    if why:
        return None, why
    return select_llm_engine(bundle, manifest, probe_llm_target(), read_index(bundle))


def component_runner(bundle: Path, manifest: dict[str, Any], name: str, choices: dict, threads: int | None,
                     spin: bool):
    """The runner for one component: ONNX Runtime on the whole graph, one engine, or a chain of segments."""
    from mmtrt.backends.tensorrt.runner import EngineRunner

    segments = (manifest.get("placement") or {}).get(name, {}).get("segments", [])
    engines = {s["id"]: choices[s["id"]][0] for s in segments if choices.get(s["id"], (None,))[0] is not None}
    if not engines:
        return OrtRunner(bundle / manifest["components"][name]["artifact"], threads, spin)
    plan = {e["id"]: e for e in manifest["tensorrt"]["segments"]}
    _register_rtx_plugins(bundle, manifest, [plan[seg] for seg, path in engines.items()
                                             if engine_flavor(path) == RTX.name])
    steps = []
    for s in segments:
        runner = (EngineRunner(engines[s["id"]], plan[s["id"]]["profiles"], flavor=engine_flavor(engines[s["id"]]))
                  if s["id"] in engines
                  else OrtRunner(bundle / s["onnx"], threads, spin))
        steps.append((runner, [t["name"] for t in s["inputs"]]))
    if len(steps) == 1:
        return steps[0][0]
    return SegmentChain(steps, [o["name"] for o in manifest["components"][name]["outputs"]])
