"""`mmtrt build-engines`: build every TensorRT segment of a bundle's plan on the target host (TensorRT 11).

NOT RUN: TensorRT cannot be installed where this was written. The calls follow the TensorRT 11 Python API as
documented in the TensorRT 11 migration guide ("Python Migration Patterns for TensorRT 11.x": strong typing is
always on, so `create_network()` takes no flags and no precision flag is set; the ONNX's tensor types decide)
and as Polygraphy's TensorRT loaders use it (NVIDIA/TensorRT tools/Polygraphy/polygraphy/backend/trt/loader.py
and config.py: parser errors, profiles, `create_timing_cache` / `set_timing_cache` / `get_timing_cache`).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from mmtrt.backends.tensorrt.engines import (
    Target,
    engine_file,
    engine_key,
    probe_target,
    read_index,
    timing_cache_file,
    write_bytes,
    write_index,
)
from mmtrt.bundle.manifest import read_manifest, sha256_file
from mmtrt.errors import UserError
from mmtrt.kernels.bundle import register_plugins

MISSING = "build-engines needs TensorRT on a GPU host; pip install mmtrt[tensorrt] there"


def import_tensorrt():
    try:
        import tensorrt
    except Exception:  # a broken install fails with more than ImportError
        raise UserError(MISSING) from None
    return tensorrt


def build_engines(bundle: str | Path, only: list[str] | None = None, force: bool = False,
                  log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Build the engines this host lacks; returns one record per segment (built, up to date or skipped)."""
    bundle = Path(bundle)
    manifest = read_manifest(bundle)
    trt = import_tensorrt()
    target = probe_target()
    if isinstance(target, str):
        raise UserError(f"{target}; {MISSING}")
    entries = _selected(manifest["tensorrt"]["segments"], only)
    index = read_index(bundle)
    cache_path = bundle / timing_cache_file(target)
    logger = trt.Logger(trt.Logger.WARNING)
    trt.init_libnvinfer_plugins(logger, "")
    register_plugins(bundle, manifest["tensorrt"].get("plugins", {}))  # mmtrt's own, checked against the manifest
    records = []
    for entry in entries:
        record = _build_one(trt, logger, bundle, entry, target, index, cache_path, force, log)
        records.append(record)
        if record["status"] == "built":
            index[record["key"]] = {k: record[k] for k in ("segment", "file", "sha256", "target", "built_at",
                                                           "build_seconds", "tensorrt", "compute_capability")}
            write_index(bundle, index)
    return records


def _selected(entries: list[dict], only: list[str] | None) -> list[dict]:
    if not only:
        return entries
    known = {e["id"] for e in entries}
    unknown = sorted(set(only) - known)
    if unknown:
        raise UserError(f"no TensorRT segment {', '.join(unknown)} in this bundle; its segments: {', '.join(sorted(known))}")
    return [e for e in entries if e["id"] in only]


def _build_one(trt, logger, bundle: Path, entry: dict, target: Target, index: dict, cache_path: Path, force: bool,
               log) -> dict[str, Any]:
    if entry["profiles"] is None:
        log(f"{entry['id']}: skipped, {entry['unbuildable']}")
        return {"segment": entry["id"], "status": "skipped", "reason": entry["unbuildable"]}
    key = engine_key(entry, target)
    path = bundle / engine_file(entry, target)
    if not force and key in index and path.is_file() and sha256_file(path) == index[key]["sha256"]:
        log(f"{entry['id']}: up to date ({index[key]['file']})")
        return {"segment": entry["id"], "status": "up to date", "key": key, "file": index[key]["file"]}
    started = time.perf_counter()
    cache = cache_path.read_bytes() if cache_path.is_file() else b""
    engine, cache = build_serialized(trt, logger, bundle, entry, cache)
    seconds = round(time.perf_counter() - started, 2)
    write_bytes(path, engine)
    write_bytes(cache_path, cache)
    log(f"{entry['id']}: built {path.relative_to(bundle)} in {seconds} s")
    return {"segment": entry["id"], "status": "built", "key": key, "file": str(path.relative_to(bundle)),
            "sha256": sha256_file(path), "target": target.tag(), "tensorrt": target.tensorrt,
            "compute_capability": target.compute_capability, "build_seconds": seconds,
            "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def build_serialized(trt, logger, bundle: Path, entry: dict, timing_cache: bytes) -> tuple[bytes, bytes]:
    """Parse the segment's ONNX, add its optimization profiles in the plan's order (the runner selects them by
    that index), build; returns the engine and the timing cache, which now holds this build's tactic timings too."""
    for lib in entry["plugins"]:
        trt.get_plugin_registry().load_library(str(bundle / lib))
    builder = trt.Builder(logger)
    network = builder.create_network()
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(bundle / entry["onnx"])):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise UserError(f"TensorRT's ONNX parser rejected {entry['onnx']} ({errors}); "
                        "the placement table is out of date for this TensorRT, report it")
    config = builder.create_builder_config()
    # TF32 is on by default and rounds fp32 GEMM inputs to 10-bit mantissas; the network is strongly typed, so
    # an fp32 tensor (a whole fp32 segment, or what cast_precision kept in fp32) means fp32.
    config.clear_flag(trt.BuilderFlag.TF32)
    for planned in entry["profiles"]:
        profile = builder.create_optimization_profile()
        for name, shapes in planned["shapes"].items():
            profile.set_shape(name, shapes["min"], shapes["opt"], shapes["max"])
        if config.add_optimization_profile(profile) < 0:
            raise UserError(f"TensorRT refused the {planned['name']} profile of {entry['id']}; recompile the bundle")
    cache = config.create_timing_cache(timing_cache)
    # A cache written on another GPU or TensorRT is rejected instead of silently mixed in (Polygraphy does the same).
    if not config.set_timing_cache(cache, ignore_mismatch=False):
        config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise UserError(f"TensorRT could not build {entry['id']}; rerun with TensorRT's verbose log for the reason")
    return bytes(engine), bytes(config.get_timing_cache().serialize())
