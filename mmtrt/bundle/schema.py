"""The manifest's own check at load: every field a runtime reads has its type and range, the fields agree with
each other, and the bundle holds only files the manifest lists and hashes. The C++ runtime checks the same
(src/manifest_schema.cpp reads the same manifest_schema.json, built in), so an edited manifest is one line
naming the field in both, never a traceback, a crash or a quietly different answer.

What this cannot see is an edit that keeps every field valid and consistent (another chat template, another
end-of-sequence id): pin the bundle's digest (`--expect-digest`) or require its signature (`--public-key`)."""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from mmtrt.bundle.manifest import BUILD_REPORT, MANIFEST
from mmtrt.errors import UserError

SIGNATURE = "model.sig"  # model-signing's default name, beside the manifest (mmtrt sign)
UNLISTED = (MANIFEST, BUILD_REPORT, SIGNATURE)
UNLISTED_FOLDERS = ("engines/",)  # built on the target by `mmtrt build-engines`; checked there against its index
SHA256 = re.compile(r"[0-9a-f]{64}")
FIX = "recompile the recipe or restore the bundle"


@lru_cache(maxsize=1)
def fields() -> list[dict[str, Any]]:
    return json.loads((Path(__file__).with_name("manifest_schema.json")).read_text())["fields"]


def check_schema(bundle: Path, manifest: dict[str, Any]) -> None:
    where = f"{bundle}/{MANIFEST}"
    for spec in fields():
        for label, value, present in _targets(manifest, spec["path"]):
            problem = _problem(spec, value, present)
            if problem:
                raise UserError(f"{where}: {label} {problem}; {FIX}")
    problem = _relations(manifest)
    if problem:
        raise UserError(f"{where}: {problem}; {FIX}")
    check_files(Path(bundle), manifest)


def _targets(manifest: dict, path: str) -> Iterator[tuple[str, Any, bool]]:
    """(label, value, present) for every place `path` names; parents that are absent or null are skipped."""
    nodes = [("", manifest)]
    parts = path.split(".")
    for depth, part in enumerate(parts):
        key, items = (part[:-2], True) if part.endswith("[]") else (part, False)
        last = depth == len(parts) - 1
        found = []
        for label, node in nodes:
            if not isinstance(node, dict):
                continue
            keys = list(node) if key == "*" else [key]
            for k in keys:
                child = f"{label}.{k}" if label else k
                if k not in node:
                    if last:
                        yield child, None, False
                    continue
                if items:
                    if isinstance(node[k], list):
                        found += [(f"{child}[{i}]", v) for i, v in enumerate(node[k])]
                else:
                    found.append((child, node[k]))
        nodes = found
    for label, value in nodes:
        yield label, value, True


def _problem(spec: dict[str, Any], value: Any, present: bool) -> str | None:
    if not present:
        return None if spec.get("optional") else "is missing"
    if value is None:
        return None if spec.get("nullable") else f"is null, it must be {_kind(spec)}"
    ok = _TYPES[spec["type"]](value, spec)
    return None if ok else f"must be {_kind(spec)}, not {_show(value)}"


def _is_int(v, spec) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and spec.get("min", v) <= v <= spec.get("max", v)


def _is_name(v, spec=None) -> bool:
    return isinstance(v, str) and v != "" and all(c >= " " and c != "\x7f" for c in v) and _utf8(v)


def _utf8(v: str) -> bool:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_path(v, spec=None) -> bool:
    return _is_name(v) and not v.startswith("/") and "\\" not in v and \
        all(part not in ("", ".", "..") for part in v.split("/"))


_TYPES = {
    "object": lambda v, s: isinstance(v, dict),
    "array": lambda v, s: isinstance(v, list) and len(v) >= s.get("min", 0),
    "int": _is_int,
    "string": lambda v, s: isinstance(v, str) and _utf8(v),
    "name": _is_name,
    "path": _is_path,
    "sha256": lambda v, s: isinstance(v, str) and SHA256.fullmatch(v) is not None,
    "dim": lambda v, s: _is_int(v, {"min": 0}) or _is_name(v),
    "enum": lambda v, s: isinstance(v, str) and v in s["values"],
}


def _kind(spec: dict[str, Any]) -> str:
    t = spec["type"]
    if t == "int":
        return f"an integer from {spec.get('min')} to {spec.get('max')}"
    if t == "enum":
        return "one of " + ", ".join(spec["values"])
    if t == "array" and spec.get("min"):
        return f"a list of at least {spec['min']}"
    return {"object": "an object", "array": "a list", "string": "a string", "name": "a non-empty name without "
            "control characters", "path": "a relative path inside the bundle", "sha256": "a sha256 (64 lowercase hex "
            "digits)", "dim": "a size or a dim name"}[t]


def _show(value: Any) -> str:
    """Compact, sorted, ASCII JSON, as the C++ runtime writes it (nlohmann's dump)."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."


def _relations(m: dict[str, Any]) -> str | None:
    """The facts that must agree; the first disagreement, in words."""
    dims, model, llm = m["dims"], m["model"], m["model"]["llm"]
    for name, r in dims.items():
        if not r["min"] <= r["opt"] or (r["max"] is not None and r["opt"] > r["max"]):
            return f"dims.{name} must have min <= opt <= max, not {_show(r)}"
    for comp, c in m["components"].items():
        for t in c["inputs"]:  # what the runtimes check shapes against (outputs may have free dims)
            unknown = [d for d in t["shape"] if isinstance(d, str) and d not in dims]
            if unknown:
                return f"components.{comp} tensor {t['name']} names dim {unknown[0]!r}, which dims lacks"
    vocab = llm["vocab_size"]
    for key, ids in (("image_token_id", [model["image_token_id"]]), ("eos_token_ids", model["eos_token_ids"])):
        if any(i >= vocab for i in ids):
            return f"model.{key} {_show(ids)} lies outside the vocabulary of {vocab} (model.llm.vocab_size)"
    pre, vision = m["components"]["preprocess"]["outputs"][0]["shape"], _tensor(m, "vision", "inputs", "pixel_values")
    rank = len(vision["shape"]) if vision else 4  # [batch, 3, H, W]; a Qwen2-VL image's patches [patches, width]
    if len(pre) != rank or (vision and any(isinstance(a, int) and isinstance(b, int) and a != b
                                        for a, b in zip(pre[1:], vision["shape"][1:]))):
        return f"components.preprocess output {_show(pre)} does not fit the vision input {_show(vision and vision['shape'])}"
    features = _tensor(m, "vision", "outputs", "image_features")
    key = "tile_tokens" if "tile_tokens" in model["vision"] else "image_tokens"  # any resolution: per tile
    tokens = model["vision"][key]
    if features and len(features["shape"]) == 3 and isinstance(features["shape"][1], int) \
            and features["shape"][1] != tokens:
        return (f"model.vision.{key} is {tokens} but the vision output holds {features['shape'][1]} per "
                f"{'tile' if key == 'tile_tokens' else 'image'}")
    return _cache_relations(m) or _plan_relations(m) or _file_relations(m)


def _tensor(m: dict, comp: str, side: str, name: str) -> dict | None:
    return next((t for t in m["components"].get(comp, {}).get(side, []) if t["name"] == name), None)


def _cache_relations(m: dict[str, Any]) -> str | None:
    llm, kv, dims = m["model"]["llm"], m["model"].get("kv_cache"), m["dims"]
    inputs = {t["name"]: t for t in m["components"]["llm"]["inputs"]}
    outputs = {t["name"] for t in m["components"]["llm"]["outputs"]}
    if not kv:
        pasts = [t for name, t in inputs.items() if name.startswith("past.")]
        if len(pasts) != 2 * llm["num_layers"]:
            return f"model.llm.num_layers is {llm['num_layers']} but the LLM takes {len(pasts)} past tensors"
        return _cache_shape(pasts, llm)
    for key in ("past", "present"):
        if "{layer}" not in kv[key] or "{kind}" not in kv[key]:
            return f"model.kv_cache.{key} must name {{layer}} and {{kind}}, not {_show(kv[key])}"
    names = [(kv["past"].replace("{layer}", str(i)).replace("{kind}", k),
              kv["present"].replace("{layer}", str(i)).replace("{kind}", k))
             for i in range(llm["num_layers"]) for k in kv["kinds"]]
    bound = [past for past in inputs if past.startswith(kv["past"].split("{")[0])]
    if any(p not in inputs or q not in outputs for p, q in names) or len(bound) != len(names):
        return (f"model.kv_cache ({llm['num_layers']} layers of {', '.join(kv['kinds'])}) does not match the LLM's "
                f"{len(bound)} cache inputs")
    first = inputs[names[0][0]]
    if first.get("dtype", kv["dtype"]) != kv["dtype"]:
        return f"model.kv_cache.dtype is {kv['dtype']} but the LLM's cache inputs are {first['dtype']}"
    if "capacity" not in dims:
        return "dims.capacity is missing (a kv_cache bundle sizes its buffers by it)"
    if kv["layout"] == "paged":
        if "block_tokens" not in kv or "pool_blocks" not in dims or "num_slots" not in dims:
            return "a paged model.kv_cache needs block_tokens and dims pool_blocks and num_slots"
        if dims["num_slots"]["max"] != (dims["pool_blocks"]["max"] or 0) * kv["block_tokens"]:
            return (f"dims.num_slots ({dims['num_slots']['max']}) must be dims.pool_blocks ({dims['pool_blocks']['max']}) "
                    f"x model.kv_cache.block_tokens ({kv['block_tokens']})")
    if dims["capacity"]["max"] is None or dims["capacity"]["max"] > llm["max_position_embeddings"]:
        return (f"dims.capacity ({dims['capacity']['max']}) exceeds the LLM's positions "
                f"({llm['max_position_embeddings']}, model.llm.max_position_embeddings)")
    return _cache_shape([first], llm)


def _cache_shape(pasts: list[dict], llm: dict[str, Any]) -> str | None:
    """The cache tensors' fixed sizes are the heads and head size the runtimes allocate by."""
    for t in pasts:
        shape = t["shape"]
        want = {-3: ("num_kv_heads", llm["num_kv_heads"]), -1: ("head_dim", llm["head_dim"])}
        for axis, (key, size) in want.items():
            if len(shape) >= 3 and isinstance(shape[axis], int) and shape[axis] != size:
                return f"model.llm.{key} is {size} but the LLM's {t['name']} has {shape[axis]}"
    return None


def _plan_relations(m: dict[str, Any]) -> str | None:
    """What the engine choice reads when a plan holds no engine: the reason it gives instead."""
    for seg in (m.get("tensorrt") or {}).get("segments", []):
        if seg["profiles"] is None and not isinstance(seg.get("unbuildable"), str):
            return f"tensorrt segment {seg['id']} has no profiles and no reason (unbuildable)"
    llm = m.get("tensorrt_llm")
    if llm and llm["checkpoint"] is None and not isinstance(llm.get("checkpoint_missing"), str):
        return "tensorrt_llm has no checkpoint and no reason (checkpoint_missing)"
    return None


def _file_relations(m: dict[str, Any]) -> str | None:
    listed = m["artifacts"]
    for comp, c in m["components"].items():
        for f in [c["artifact"], *c.get("files", [])]:
            if f not in listed:
                return f"components.{comp} reads {f}, which artifacts does not list (nor hash)"
    for seg in (m.get("tensorrt") or {}).get("segments", []):
        for f in seg.get("files", []):
            if f not in listed:
                return f"tensorrt segment {seg['id']} reads {f}, which artifacts does not list (nor hash)"
    for comp, place in (m.get("placement") or {}).items():
        for seg in place.get("segments", []):
            if "onnx" in seg and seg["onnx"] not in listed:
                return f"placement.{comp} segment {seg['id']} reads {seg['onnx']}, which artifacts does not list (nor hash)"
    return None


def check_token_ids(bundle: Path, model: dict[str, Any], special: dict[str, int]) -> None:
    """The manifest's token ids are the tokenizer's: the image placeholder's id, and end-of-sequence ids that are
    special tokens (`special`: each special token's text and id)."""
    where = f"{bundle}/{MANIFEST}"
    if special.get(model["image_token"]) != model["image_token_id"]:
        raise UserError(f"{where}: model.image_token_id is {model['image_token_id']} but the tokenizer gives "
                        f"{model['image_token']} the id {special.get(model['image_token'])}; {FIX}")
    ids = set(special.values())
    for eos in model["eos_token_ids"]:
        if eos not in ids:
            raise UserError(f"{where}: model.eos_token_ids holds {eos}, which is not a special token of the "
                            f"tokenizer; {FIX}")


def check_files(bundle: Path, manifest: dict[str, Any]) -> None:
    """Every file in the bundle is listed (so hashed), and every listed path stays inside it, links resolved."""
    root = os.path.realpath(bundle)
    for name in manifest["artifacts"]:
        try:
            real = Path(bundle, name).resolve(strict=False)
        except (OSError, RuntimeError) as exc:
            raise UserError(f"{bundle}/{name} cannot be resolved ({exc}); {FIX}") from None
        if os.path.commonpath([root, str(real)]) != root:
            raise UserError(f"{bundle}/{name} leads outside the bundle (to {real}); {FIX}")
    unlisted = sorted(set(_files(Path(bundle))) - set(manifest["artifacts"]) - set(UNLISTED))
    if unlisted:
        raise UserError(f"{bundle} holds {', '.join(unlisted[:3])}, which manifest.json does not list (nor hash); "
                        f"remove it or {FIX}")


def _files(bundle: Path) -> Iterator[str]:
    for folder, subdirs, files in os.walk(bundle, onerror=None, followlinks=False):
        rel = os.path.relpath(folder, bundle)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        if any(prefix.startswith(f) for f in UNLISTED_FOLDERS):
            subdirs[:] = []
            continue
        links = [d for d in subdirs if os.path.islink(os.path.join(folder, d))]
        yield from (prefix + f for f in files + links)
