"""`mmtrt build-engines BUNDLE --plan`: what a build for a target would do here, for a person or (`--json`) a program.

The target is resolved on this host (TensorRT-RTX's version, or this GPU and its TensorRT), so each printed line
names real files and runs as printed; where the target cannot be resolved here the report says why instead of
printing a line with a hole in it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmtrt.backends.tensorrt.engines import Target, engine_file, engine_key, probe_target, read_index, rtx_target
from mmtrt.backends.tensorrt.flavors import FLAVORS, RTX, Flavor
from mmtrt.backends.tensorrt.plan import trtexec_command


def resolve_target(flavor: Flavor) -> Target | str:
    """The target a build here would have, or why there is none."""
    if flavor is RTX:
        try:
            return rtx_target(flavor.load().__version__)
        except Exception as exc:  # a broken install fails with more than ImportError
            return f"{flavor.module} does not import here ({type(exc).__name__}); install {flavor.install}"
    return probe_target(flavor)


def plan_report(bundle: Path, manifest: dict[str, Any], target_name: str) -> dict[str, Any]:
    flavor = FLAVORS[target_name]
    target = resolve_target(flavor)
    index = read_index(bundle)
    segments = [_segment(e, flavor, target, index, bundle) for e in manifest["tensorrt"]["segments"]]
    return {"target": target_name, "resolved": target.tag() if isinstance(target, Target) else None,
            "unresolved": target if isinstance(target, str) else None, "segments": segments,
            "plugins": manifest["tensorrt"].get("plugins") or {}}


def _segment(entry: dict, flavor: Flavor, target: Target | str, index: dict, bundle: Path) -> dict[str, Any]:
    out = {"id": entry["id"], "onnx": entry.get("tensorrt_onnx", entry["onnx"]), "precision": entry["precision"]["dtype"],
           "profiles": entry["profiles"], "aot_plugins": entry.get("aot_plugins", []),
           "command": f"mmtrt build-engines {bundle} --target {flavor.name} --segment {entry['id']}"}
    if entry["profiles"] is None:
        return {**out, "command": None, "skip": entry["unbuildable"]}
    if not isinstance(target, Target):
        return out
    key = engine_key(entry, target)
    out.update(engine=engine_file(entry, target), built=key in index)
    if flavor is not RTX and not out["aot_plugins"]:
        out["trtexec"] = trtexec_command(entry, target)
    return out


def describe_plan(report: dict[str, Any]) -> str:
    """The report as a person reads it: per segment its profiles, then how to build it."""
    head = (f"target {report['target']}: {report['resolved']}" if report["resolved"]
            else f"target {report['target']}: not resolvable here ({report['unresolved']}); the engine names and "
                 "trtexec lines are printed on a host that resolves it")
    lines = [head, ""]
    for s in report["segments"]:
        lines.append(f"{s['id']}  {s['onnx']}  {s['precision']}" + (f"  plugins {', '.join(s['aot_plugins'])}"
                                                                   if s["aot_plugins"] else ""))
        for p in s["profiles"] or []:
            lines.append(f"  profile {p['name']}: {_ranges(p)}")
        if s.get("skip"):
            lines.append(f"  not buildable: {s['skip']}")
            continue
        if "engine" in s:
            lines.append(f"  engine {s['engine']}" + (" (built)" if s["built"] else ""))
        lines.append(f"  {s['command']}")
        if s.get("trtexec"):
            lines.append(f"  or, in the bundle folder: {s['trtexec']}")
    llm = report.get("tensorrt_llm")
    if llm:
        lines += ["", f"tensorrt-llm: {llm.get('skipped') and 'not buildable here: ' + llm['skipped'] or llm['command']}"]
    return "\n".join(lines)


def _ranges(profile: dict[str, Any]) -> str:
    """min..max (opt) per input; inputs with the same range share one entry (the KV cache's)."""
    groups: dict[str, list[str]] = {}
    for name, v in profile["shapes"].items():
        groups.setdefault(f"{v['min']}..{v['max']} (opt {v['opt']})", []).append(name)
    for name, v in profile.get("values", {}).items():
        groups.setdefault(f"values {v['min']}..{v['max']} (opt {v['opt']})", []).append(name)
    return "; ".join(f"{names[0]}{f' (+{len(names) - 1} alike)' if len(names) > 1 else ''} {text}"
                     for text, names in groups.items())
