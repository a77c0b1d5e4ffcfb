"""`mmtrt inspect`: the manifest as a person reads it, or as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmtrt.bundle.manifest import BUILD_REPORT, bundle_hash, read_manifest, verify_artifacts


def inspect_json(bundle: str | Path) -> dict[str, Any]:
    bundle = Path(bundle)
    manifest = read_manifest(bundle)
    report = bundle / BUILD_REPORT
    return {
        "bundle": str(bundle),
        "bundle_sha256": bundle_hash(bundle),
        "artifacts_modified": verify_artifacts(bundle, manifest),
        "manifest": manifest,
        "build_report": json.loads(report.read_text()) if report.is_file() else None,
    }


def _fmt_changes(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in changes.items())


def describe(bundle: str | Path) -> str:
    info = inspect_json(bundle)
    m = info["manifest"]
    model, v, t = m["model"], m["model"]["vision"], m["model"]["llm"]
    lines = [
        f"bundle {info['bundle']}  sha256 {info['bundle_sha256'][:16]}  schema {m['schema_version']}  mmtrt {m['mmtrt_version']}",
        f"model: {v['model_type']} {v['input_size'][0]}x{v['input_size'][1]}/{v['patch_size']} -> {v['image_tokens']} image tokens; "
        f"{t['model_type']} {t['num_layers']} layers, hidden {t['hidden_size']}, {t['num_heads']} heads / {t['num_kv_heads']} KV heads",
        "",
        "partitions:",
    ]
    for name, p in m["partitions"].items():
        comp = m["components"][name]
        lines.append(f"  {name:<10} {p['chosen']:<12} (preferred {p['preferred']}) {comp['artifact']}: {p['reason']}")
    lines += ["", "profiles (min / opt / max):"]
    for comp, inputs in m["profiles"].items():
        for name, prof in inputs.items():
            lines.append(f"  {comp}.{name:<18} {prof['min']} / {prof['opt']} / {prof['max']}")
    lines += ["", "passes:"] + [f"  {i + 1}. {r['pass']} {json.dumps(r['config'])}: {_fmt_changes(r['changes'])}"
                                for i, r in enumerate(m["passes"])] or ["  (none)"]
    lines += ["", "artifacts:"] + [f"  {digest[:16]}  {name}" for name, digest in m["artifacts"].items()]
    if info["artifacts_modified"]:
        lines.append(f"WARNING: modified since compile: {', '.join(info['artifacts_modified'])}")
    return "\n".join(lines)
