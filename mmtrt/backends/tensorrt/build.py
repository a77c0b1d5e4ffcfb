"""`mmtrt build-engines`: build every TensorRT segment of a bundle's plan, with TensorRT 11 on its GPU host or with
TensorRT-RTX on any host (`flavors.py`: one API, two module names; this is the one build path for both).

Each segment gets a record and the next segment is built whatever happened to this one: `built`, `up to date`,
`skipped` (no profile, or plugins the builder cannot register: the reason says which) or `failed` (the parser's or
the builder's own messages). The calls are those of Polygraphy's TensorRT loaders (NVIDIA/TensorRT
tools/Polygraphy/polygraphy/backend/trt/loader.py and config.py); the network is strongly typed, as TensorRT 11
and TensorRT-RTX always are, so `create_network()` takes no flags and the ONNX's tensor types decide precision.
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
    gpu_capability,
    probe_target,
    read_index,
    rtx_target,
    timing_cache_file,
    write_bytes,
    write_index,
)
from mmtrt.backends.tensorrt.flavors import FLAVORS, RTX, Flavor, rtx_host_note, set_rtx_targets
from mmtrt.bundle.manifest import read_manifest, sha256_file
from mmtrt.errors import UserError
from mmtrt.kernels.bundle import register_plugins

INDEXED = ("segment", "file", "sha256", "target", "flavor", "built_at", "build_seconds", "tensorrt",
           "compute_capability")


def import_flavor(flavor: Flavor):
    try:
        return flavor.load()
    except Exception as exc:  # a broken install fails with more than ImportError
        other = "" if flavor is RTX else f"; --target rtx builds TensorRT-RTX engines on any host ({RTX.install})"
        raise UserError(f"build-engines --target {flavor.name} needs {flavor.module}, which does not import here "
                        f"({type(exc).__name__}); install {flavor.install}{other}") from None


def build_target(trt, flavor: Flavor) -> Target:
    """What this build targets: TensorRT-RTX's compute capability list on any host, else this host's GPU."""
    if flavor is RTX:
        return rtx_target(trt.__version__)
    target = probe_target(flavor)
    if isinstance(target, str):
        raise UserError(f"{target}: --target tensorrt builds on the GPU the engines will run on; "
                        f"--target rtx builds here ({RTX.install})")
    return target


def build_engines(bundle: str | Path, only: list[str] | None = None, force: bool = False, target: str = "tensorrt",
                  log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Build the engines the bundle lacks for `target` ("tensorrt" or "rtx"); one record per segment."""
    bundle, flavor = Path(bundle), FLAVORS[target]
    manifest = read_manifest(bundle)
    entries = _selected(manifest["tensorrt"]["segments"], only)
    trt = import_flavor(flavor)
    goal = build_target(trt, flavor)
    note = rtx_host_note(gpu_capability()) if flavor is RTX else None
    if note:
        log(f"note: {note}")
    index = read_index(bundle)
    cache_path = bundle / timing_cache_file(goal)
    plugins_missing = _register_plugins(trt, flavor, bundle, manifest, entries)
    records = []
    for entry in entries:
        record = _build_one(trt, bundle, entry, goal, index, cache_path, force, plugins_missing)
        log(_line(record))
        records.append(record)
        if record["status"] == "built":
            index[record["key"]] = {k: record[k] for k in INDEXED}
            write_index(bundle, index)
    return records


def _line(record: dict[str, Any]) -> str:
    status = record["status"]
    if status == "built":
        return f"{record['segment']}: built {record['file']} in {record['build_seconds']} s"
    if status == "up to date":
        return f"{record['segment']}: up to date ({record['file']})"
    return f"{record['segment']}: {status}: {record['reason']}"


def _selected(entries: list[dict], only: list[str] | None) -> list[dict]:
    if not only:
        return entries
    known = {e["id"] for e in entries}
    unknown = sorted(set(only) - known)
    if unknown:
        raise UserError(f"no TensorRT segment {', '.join(unknown)} in this bundle; its segments: {', '.join(sorted(known))}")
    return [e for e in entries if e["id"] in only]


def _register_plugins(trt, flavor: Flavor, bundle: Path, manifest: dict, entries: list[dict]) -> str | None:
    """None when every plugin the selected segments call is registered (TensorRT 11: the bundle's tensorrt.plugin
    AOT registration; TensorRT-RTX: mmtrt.kernels.rtx's IPluginV3 creators); otherwise why they cannot be."""
    plugins = manifest["tensorrt"].get("plugins") or {}
    if not any(e.get("aot_plugins") for e in entries):
        return None
    trt.init_libnvinfer_plugins(trt.Logger(trt.Logger.WARNING), "")
    try:
        register_plugins(bundle, plugins, trt)  # checked against the manifest first (a mismatch is a UserError)
    except UserError:
        raise
    except Exception as exc:  # the registration runs tensorrt.plugin's validators, or builds RTX's link library
        return f"registering mmtrt's plugins with {flavor.module} failed ({type(exc).__name__}: {exc})"
    return None


def _build_one(trt, bundle: Path, entry: dict, target: Target, index: dict, cache_path: Path, force: bool,
               plugins_missing: str | None) -> dict[str, Any]:
    head = {"segment": entry["id"], "target": target.tag(), "flavor": target.flavor}
    if entry["profiles"] is None:
        return {**head, "status": "skipped", "stage": "plan", "reason": entry["unbuildable"]}
    if entry.get("aot_plugins") and plugins_missing:
        return {**head, "status": "skipped", "stage": "plugins",
                "reason": f"calls {', '.join(entry['aot_plugins'])}: {plugins_missing}"}
    key = engine_key(entry, target)
    rel = engine_file(entry, target)
    path = bundle / rel
    if not force and key in index and path.is_file() and sha256_file(path) == index[key]["sha256"]:
        return {**head, "status": "up to date", "key": key, "file": rel}
    started = time.perf_counter()
    cache = cache_path.read_bytes() if cache_path.is_file() else b""
    try:
        engine, cache = build_serialized(trt, bundle, entry, cache)
    except BuildError as exc:
        return {**head, "status": "failed", "stage": exc.stage, "reason": str(exc)}
    seconds = round(time.perf_counter() - started, 2)
    write_bytes(path, engine)
    if cache:
        write_bytes(cache_path, cache)
    return {**head, "status": "built", "key": key, "file": rel, "sha256": sha256_file(path), "build_seconds": seconds,
            "tensorrt": target.tensorrt, "compute_capability": target.compute_capability, "engine_bytes": len(engine),
            "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


class BuildError(Exception):
    """The parser or the builder refused a segment; `stage` says which, the message is theirs."""

    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage = stage


def collecting_logger(trt):
    """A TensorRT logger that keeps the errors (the builder's reasons) instead of printing them."""

    class Collecting(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg):
            if severity in (trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR):
                self.errors.append(msg)

    return Collecting()


def parse(trt, logger, builder, onnx_path: Path):
    """The network TensorRT's ONNX parser makes of `onnx_path`, or BuildError with the parser's messages."""
    network = builder.create_network()
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise BuildError("parse", "; ".join(parser_error(parser.get_error(i)) for i in range(parser.num_errors)))
    return network, parser


def parser_error(error) -> str:
    """One parser error as `node NAME (OP): what`, without the CUDA-runtime noise a GPU-less host appends."""
    lines = [line for line in error.desc().splitlines() if "catchCudaError" not in line]
    return f"node {error.node_name() or error.node()} ({error.node_operator()}): {' '.join(lines)}"


def build_serialized(trt, bundle: Path, entry: dict, timing_cache: bytes) -> tuple[bytes, bytes]:
    """Parse the segment's TensorRT form, add its optimization profiles in the plan's order (the runners select
    them by that index), build; returns the engine and the timing cache, which now holds this build's timings."""
    logger = collecting_logger(trt)
    for lib in entry["plugins"]:
        trt.get_plugin_registry().load_library(str(bundle / lib))
    builder = trt.Builder(logger)
    network, _parser = parse(trt, logger, builder, bundle / entry.get("tensorrt_onnx", entry["onnx"]))
    config = builder.create_builder_config()
    if trt.__name__ == RTX.module:
        set_rtx_targets(trt, config)
    # TF32 rounds fp32 GEMM inputs to 10-bit mantissas; the network is strongly typed, so an fp32 tensor (a whole
    # fp32 segment, or what cast_precision kept in fp32) means fp32.
    config.clear_flag(trt.BuilderFlag.TF32)
    for planned in entry["profiles"]:
        profile = builder.create_optimization_profile()
        for name, shapes in planned["shapes"].items():
            profile.set_shape(name, shapes["min"], shapes["opt"], shapes["max"])
        for name, values in planned.get("values", {}).items():
            profile.set_shape_input(name, values["min"], values["opt"], values["max"])
        if config.add_optimization_profile(profile) < 0:
            raise BuildError("profile", f"the {planned['name']} profile was refused: {'; '.join(logger.errors)}")
    rtx = trt.__name__ == RTX.module
    if not rtx:  # TensorRT-RTX times nothing ahead of time: its timing cache calls are deprecated no-ops
        cache = config.create_timing_cache(timing_cache)
        # A cache written on another GPU or TensorRT is rejected instead of silently mixed in (as Polygraphy does).
        if not config.set_timing_cache(cache, ignore_mismatch=False):
            config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise BuildError("build", "; ".join(logger.errors) or "the builder returned no engine and logged no error")
    return bytes(engine), b"" if rtx else bytes(config.get_timing_cache().serialize())
