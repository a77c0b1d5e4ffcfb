"""The engine cache: engines live in BUNDLE/engines under a key made of everything they depend on.

A TensorRT engine runs only on the GPU model and TensorRT version that built it, so the key is the segment's
digest (its ONNX and weights), the optimization profile, the GPU's compute capability and the TensorRT version.
A TensorRT-RTX engine runs on every GPU of the compute capabilities it was built for, with that TensorRT-RTX
version: its key names the version and the list (`flavors.py`). engines/index.json maps keys to files; it is
written by `mmtrt build-engines` and is not part of the bundle's hash (the portable bundle is the ONNX).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmtrt.backends.tensorrt.flavors import RTX, RTX_COMPUTE_CAPABILITIES, TENSORRT, Flavor
from mmtrt.bundle.manifest import dumps, sha256_file
from mmtrt.errors import UserError

ENGINE_DIR = "engines"
INDEX = f"{ENGINE_DIR}/index.json"


@dataclass(frozen=True)
class Target:
    """What an engine is specific to: the compute capability it runs on ("9.0"; for TensorRT-RTX the list it was
    built for, "8.0,8.6,8.9,12.0"), the TensorRT (or TensorRT-RTX) version, and which of the two built it."""

    compute_capability: str
    tensorrt: str
    flavor: str = TENSORRT.name

    def tag(self) -> str:
        ccs = "_".join(cc.replace(".", "") for cc in self.compute_capability.split(","))
        if self.flavor == RTX.name:
            return f"rtx{self.tensorrt}-sm{ccs}"
        return f"sm{ccs}-trt{self.tensorrt}"


def rtx_target(version: str) -> Target:
    """What a TensorRT-RTX build of this version targets, on any host."""
    return Target(",".join(RTX_COMPUTE_CAPABILITIES), version, RTX.name)


def gpu_capability() -> str | None:
    """The first CUDA GPU's compute capability ("9.0"), from the CUDA driver itself (libcuda's cuInit,
    cuDeviceGet and cuDeviceGetAttribute 75/76, the major and minor numbers), or None without one; no torch."""
    try:
        driver = ctypes.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
    except OSError:
        return None
    device, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGet(ctypes.byref(device), 0) != 0:
        return None
    if (driver.cuDeviceGetAttribute(ctypes.byref(major), 75, device) != 0
            or driver.cuDeviceGetAttribute(ctypes.byref(minor), 76, device) != 0):
        return None
    return f"{major.value}.{minor.value}"


def probe_gpu(module: str) -> tuple[str, str] | str:
    """This host's compute capability and `module`'s version, or why engines of `module` cannot run here."""
    try:
        found = importlib.import_module(module)
    except Exception as exc:  # a broken install fails with more than ImportError
        return f"{module} is not importable on this host ({type(exc).__name__}: {exc})"
    capability = gpu_capability()
    if capability is None:
        return f"{module} {found.__version__} imports but no CUDA GPU is visible"
    return capability, found.__version__


def probe_target(flavor: Flavor = TENSORRT) -> Target | str:
    """The target whose engines this host runs, or why it runs none of `flavor`'s. A TensorRT-RTX host runs the
    engines built for a list holding its GPU's compute capability."""
    found = probe_gpu(flavor.module)
    if isinstance(found, str):
        return found
    capability, version = found
    if flavor is RTX:
        if capability not in RTX_COMPUTE_CAPABILITIES:
            return (f"this GPU's compute capability {capability} is not among the TensorRT-RTX engines' targets "
                    f"({', '.join(RTX_COMPUTE_CAPABILITIES)})")
        return rtx_target(version)
    return Target(capability, version)


def profile_digest(profiles: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(profiles, sort_keys=True).encode()).hexdigest()[:12]


def engine_key(entry: dict[str, Any], target: Target) -> str:
    return _key(entry, target.tag())


def _key(entry: dict[str, Any], tag: str) -> str:
    return f"{entry['sha256'][:16]}-{profile_digest(entry['profiles'])}-{tag}"


def engine_name(entry: dict[str, Any], tag: str) -> str:
    """`engines/<segment>-<key>.engine`; `tag` is a target's tag, or a placeholder in a command line."""
    return f"{ENGINE_DIR}/{entry['id']}-{_key(entry, tag)}.engine"


def engine_file(entry: dict[str, Any], target: Target) -> str:
    return engine_name(entry, target.tag())


def timing_cache_file(target: Target) -> str:
    """One timing cache per target: tactic timings are only valid on the GPU and TensorRT that measured them."""
    return f"{ENGINE_DIR}/timing-{target.tag()}.cache"


def read_index(bundle: Path) -> dict[str, dict[str, Any]]:
    path = Path(bundle) / INDEX
    if not path.is_file():
        return {}
    try:
        index = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path} ({exc}); delete it and rerun `mmtrt build-engines`") from None
    if not isinstance(index, dict) or not all(isinstance(v, dict) for v in index.values()):
        raise UserError(f"{path} is not an engine index (a JSON object of entries); delete it and rerun "
                        "`mmtrt build-engines`")
    return index


def write_bytes(path: Path, data: bytes) -> None:
    """Write through a temporary file and rename, so a killed build never leaves half an engine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_index(bundle: Path, index: dict[str, dict[str, Any]]) -> None:
    write_bytes(Path(bundle) / INDEX, dumps(index).encode())


def select(bundle: Path, entry: dict[str, Any], target: Target | str, index: dict[str, dict]) -> tuple[Path | None, str]:
    """The engine that runs a TensorRT segment on this host, or None and why ONNX Runtime runs it instead. An
    engine that trtexec wrote under the planned name (the plan's `trtexec` line) counts too: it has no index
    record, so nothing vouches for its content beyond its name."""
    if entry["profiles"] is None:
        return None, f"{entry['id']} has no TensorRT profile ({entry['unbuildable']})"
    if isinstance(target, str):
        return None, target
    record = index.get(engine_key(entry, target))
    if record is None:
        unindexed = Path(bundle) / engine_file(entry, target)
        if unindexed.is_file():
            return unindexed, f"engine {engine_file(entry, target)} (not in {INDEX}: built outside build-engines)"
        built = sorted(r["target"] for r in index.values() if r["segment"] == entry["id"])
        others = f" (built for: {', '.join(built)})" if built else ""
        return None, (f"no engine for {entry['id']} matches {target.tag()}{others}; "
                      "run `mmtrt build-engines BUNDLE` on this host")
    path = Path(bundle) / record["file"]
    if not path.is_file() or sha256_file(path) != record["sha256"]:
        return None, f"engine {record['file']} is missing or modified; run `mmtrt build-engines BUNDLE --force`"
    return path, f"engine {record['file']}"
