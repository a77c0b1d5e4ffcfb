"""What differs between two bundles besides their numbers: partitions, placements, precisions, passes."""

from __future__ import annotations

import json
from typing import Any


def bundle_differences(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per difference: what kind, where, the value in A and in B."""
    return [*_partitions(a, b), *_placements(a, b), *_precisions(a, b), *_passes(a, b)]


def _row(what: str, where: str, in_a, in_b) -> dict[str, Any]:
    return {"what": what, "where": where, "a": in_a, "b": in_b}


def _partitions(a, b) -> list[dict]:
    rows = []
    for comp in sorted(set(a["partitions"]) | set(b["partitions"])):
        pa, pb = a["partitions"].get(comp, {}), b["partitions"].get(comp, {})
        for key in ("candidates", "planned"):
            if pa.get(key) != pb.get(key):
                rows.append(_row(f"partition {key}", comp, pa.get(key), pb.get(key)))
    return rows


def _segments(manifest, comp) -> list[str]:
    segments = (manifest.get("placement") or {}).get(comp, {}).get("segments", [])
    return [f"{s['id']} {s['backend']} ({s['nodes']} nodes)" for s in segments]


def _placements(a, b) -> list[dict]:
    rows = []
    for comp in sorted(set(a.get("placement") or {}) | set(b.get("placement") or {})):
        if _segments(a, comp) != _segments(b, comp):
            rows.append(_row("segments", comp, _segments(a, comp), _segments(b, comp)))
        na = {n["name"]: n["backend"] for n in (a.get("placement") or {}).get(comp, {}).get("nodes", [])}
        nb = {n["name"]: n["backend"] for n in (b.get("placement") or {}).get(comp, {}).get("nodes", [])}
        moved = sorted(n for n in set(na) & set(nb) if na[n] != nb[n])
        if moved:
            rows.append(_row("node backends", comp, {n: na[n] for n in moved}, {n: nb[n] for n in moved}))
    return rows


def _precision_by_segment(manifest) -> dict[str, str]:
    return {e["id"]: e["precision"]["dtype"] for e in (manifest.get("tensorrt") or {}).get("segments", [])}


def _precisions(a, b) -> list[dict]:
    pa, pb = _precision_by_segment(a), _precision_by_segment(b)
    return [_row("precision", seg, pa.get(seg), pb.get(seg)) for seg in sorted(set(pa) | set(pb))
            if pa.get(seg) != pb.get(seg)]


def _passes(a, b) -> list[dict]:
    la = [f"{p['pass']} {json.dumps(p['config'], sort_keys=True)}" for p in a["passes"]]
    lb = [f"{p['pass']} {json.dumps(p['config'], sort_keys=True)}" for p in b["passes"]]
    return [] if la == lb else [_row("passes", "recipe", la, lb)]
