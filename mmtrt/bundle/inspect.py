"""`mmtrt inspect`: the manifest as a person reads it, or as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmtrt.backends.tensorrt.engines import read_index
from mmtrt.backends.tensorrt.flavors import gpus_of
from mmtrt.bundle.manifest import bundle_hash, read_build_report, read_manifest, verify_artifacts
from mmtrt.partition.needs import host_line
from mmtrt.runtime.host import host_backends


def inspect_json(bundle: str | Path) -> dict[str, Any]:
    bundle = Path(bundle)
    manifest = read_manifest(bundle)
    return {
        "bundle": str(bundle),
        "bundle_sha256": bundle_hash(bundle),
        "artifacts_modified": verify_artifacts(bundle, manifest),
        "manifest": manifest,
        "this_host": host_backends(bundle, manifest),
        "engines": read_index(bundle),
        "build_report": read_build_report(bundle),
    }


def _fmt_changes(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in changes.items())


def _image_tokens(vision: dict) -> str:
    """A fixed count, or an any-resolution image's bound: its tiles' grid varies with the image."""
    anyres = vision.get("anyres")
    if anyres is None:
        return f"{vision['image_tokens']} image tokens"
    return (f"up to {vision['image_tokens']} image tokens (any resolution: the base and up to {anyres['max_tiles']} "
            f"tiles, {anyres['layout']} layout)")


def describe(bundle: str | Path) -> str:
    info = inspect_json(bundle)
    m = info["manifest"]
    model, v, t = m["model"], m["model"]["vision"], m["model"]["llm"]
    lines = [
        f"bundle {info['bundle']}  schema {m['schema_version']}  mmtrt {m['mmtrt_version']}",
        f"digest sha256:{info['bundle_sha256']}  (pin it: mmtrt run --expect-digest, mmtrt-run --expect-digest)",
        f"model: {v['model_type']} {v['input_size'][0]}x{v['input_size'][1]}/{v['patch_size']} -> {_image_tokens(v)}; "
        f"{t['model_type']} {t['num_layers']} layers, hidden {t['hidden_size']}, {t['num_heads']} heads / {t['num_kv_heads']} KV heads",
        "",
        "partitions:",
    ]
    host = host_backends(Path(bundle), m)
    for name, p in m["partitions"].items():
        comp = m["components"][name]
        lines.append(f"  {name:<10} planned {p['planned']:<12} {comp['artifact']}: {p['reason']}")
        lines.append(f"  {'':<10} {host_line(p['planned'], host[name])}")
    if m.get("polygraphy"):
        lines += ["", "polygraphy (run in the bundle folder; consistent inputs: a prefill, then a decode step):"]
        lines += [f"  {p['command']}" if p["data_loader"] else f"  {name}: no loader ({p['why']})"
                  for name, p in m["polygraphy"].items()]
    lines += ["", "profiles (min / opt / max):"]
    for comp, inputs in m["profiles"].items():
        for name, prof in inputs.items():
            lines.append(f"  {comp}.{name:<18} {' / '.join(_shape(prof[k]) for k in ('min', 'opt', 'max'))}")
    lines += ["", "passes:"] + [f"  {i + 1}. {r['pass']} {json.dumps(r['config'])}: {_fmt_changes(r['changes'])}"
                                for i, r in enumerate(m["passes"])] or ["  (none)"]
    lines += _plugins(m)
    lines += _engines(info["engines"])
    lines += ["", "artifacts:"] + [f"  {digest[:16]}  {name}" for name, digest in m["artifacts"].items()]
    if info["artifacts_modified"]:
        lines.append(f"WARNING: modified since compile: {', '.join(info['artifacts_modified'])}")
    return "\n".join(lines)


def _engines(index: dict[str, dict[str, Any]]) -> list[str]:
    """The engines built into engines/ (build-engines, or the recipe's output.engines), per segment and target."""
    if not index:
        return ["", "engines: none built (mmtrt build-engines BUNDLE --target rtx builds them on any host)"]
    lines = ["", "engines:"]
    for r in sorted(index.values(), key=lambda r: (r["segment"], r["target"])):
        lines.append(f"  {r['segment']:<10} {r.get('flavor', 'tensorrt'):<9} {r['target']:<30} {r['file']}")
        if r.get("compute_capability"):
            lines.append(f"    runs on GPUs of compute capability {gpus_of(r['compute_capability'])}")
    return lines


PIPELINE_ORDER = ("vision", "embed", "llm")


def _shape(dims: list[int | None]) -> str:
    """`[1, 3, 224, 224]`; an unbounded dimension (an image file's side) as `any`."""
    return "[" + ", ".join("any" if d is None else str(d) for d in dims) + "]"


def _tensor(t: dict[str, Any]) -> str:
    shape = ",".join("?" if d is None else str(d) for d in t["shape"] or [])
    return f"{t['name']} {t['dtype']}[{shape}]"


def _fallbacks(nodes: list[dict[str, Any]], limit: int = 8) -> list[str]:
    """ONNX Runtime nodes grouped by reason, a few names each."""
    by_reason: dict[str, list[str]] = {}
    for n in nodes:
        if n["backend"] != "tensorrt":
            by_reason.setdefault(n["reason"], []).append(f"{n['name']} ({n['op']})")
    lines = []
    for reason, names in by_reason.items():
        more = f" and {len(names) - limit} more" if len(names) > limit else ""
        lines.append(f"    onnxruntime because {reason}: {', '.join(names[:limit])}{more}")
    return lines


def _plugin_nodes(nodes: list[dict[str, Any]], segment: str) -> list[str]:
    """The segment's mmtrt plugin nodes (fuse_plugins), counted per plugin with the first names."""
    by_plugin: dict[str, list[str]] = {}
    for n in nodes:
        if n["segment"] == segment and n["reason"].startswith("mmtrt plugin "):
            by_plugin.setdefault(n["reason"].split()[2], []).append(n["name"])
    return [f"    plugin {pid}: {len(names)} node(s), {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
            for pid, names in sorted(by_plugin.items())]


def _plugins(manifest: dict[str, Any]) -> list[str]:
    plugins = manifest.get("tensorrt", {}).get("plugins") or {}
    lines = ["", "plugins (TensorRT, AOT):"] if plugins else []
    for pid, e in sorted(plugins.items()):
        isa = f" (ISA {e['ptx_isa']})" if "ptx_isa" in e else ""
        lines.append(f"  {pid} v{e['version']} kernel {e['kernel']}_*: PTX {e['ptx_target']}{isa}, cubins "
                     f"{', '.join(e['architectures'])}; {len(e['sha256'])} files, registration {e['registration']}")
    return lines


def describe_placement(bundle: str | Path) -> str:
    """Per component its segments (backend, size, boundary tensors) and why any node falls back."""
    m = read_manifest(Path(bundle))
    if "placement" not in m:
        return f"{bundle} was compiled before placement was recorded; recompile it with this mmtrt"
    first = next(iter(m["placement"].values()), {})
    lines = [f"placement for TensorRT hosts (operator table: {first.get('table')}; "
             f"min segment size {first.get('min_segment_size')})"]
    plan = {e["id"]: e for e in m["tensorrt"]["segments"]}
    for comp, p in sorted(m["placement"].items(), key=lambda item: PIPELINE_ORDER.index(item[0])):
        on_trt = sum(n["backend"] == "tensorrt" for n in p["nodes"])
        lines.append(f"{comp}: {len(p['segments'])} segment(s), {on_trt}/{len(p['nodes'])} nodes in TensorRT")
        lines += [f"  KV cache on {backend}: {form}" for backend, form in p.get("kv_cache_forms", {}).items()]
        for s in p["segments"]:
            entry = plan.get(s["id"])
            extra = f", {entry['precision']['dtype']}" if entry else ""
            lines.append(f"  {s['id']:<12} {s['backend']:<12} {s['nodes']:>5} nodes  {s['onnx']}{extra}")
            lines.append(f"    in:  {'; '.join(_tensor(t) for t in s['inputs'])}")
            lines.append(f"    out: {'; '.join(_tensor(t) for t in s['outputs'])}")
            if entry and entry["profiles"] is None:
                lines.append(f"    not buildable: {entry['unbuildable']}")
            lines += _plugin_nodes(p["nodes"], s["id"])
        lines += _fallbacks(p["nodes"])
    llm = m.get("tensorrt_llm")
    if llm:
        lines += ["", f"tensorrt-llm ({llm['component']}): {llm['command']}"]
        if llm["checkpoint_missing"]:
            lines.append(f"  {llm['checkpoint_missing']}")
    return "\n".join(lines)
