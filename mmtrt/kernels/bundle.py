"""The plugin files a bundle carries and their manifest entries (manifest `tensorrt.plugins`): per plugin its
name, version, namespace, kernel, architectures and the sha256 of each file. The files are the PTX TensorRT's AOT
interface compiles into the engine, the cubins (sm_80 to sm_90, for CUDA-level checks such as
scripts/gpu_check.sh), the registration module `mmtrt build-engines` imports and the launch geometry it reads. All
are built from the committed sources by mmtrt.kernels.build, so the same recipe gives the same bytes.

The PTX carries the ISA version of the nvcc that wrote it (`.version 9.0` from CUDA 13): the entry records the ISA
and the driver that loads it (mmtrt/kernels/driver.py: R580 or newer for 9.0); the cubins need no JIT."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

from mmtrt.bundle.manifest import sha256_file
from mmtrt.errors import UserError
from mmtrt.kernels import build, driver
from mmtrt.kernels.catalog import BY_NAME, NAMESPACE

PLUGIN_DIR = "plugins"
REGISTRATION = Path(__file__).with_name("registration.py")
LAUNCH = Path(__file__).with_name("launch.py")
_REGISTERED: dict[str, str] = {}  # the plugin files TensorRT 11 registered in this process, and from which bundle


def write_plugins(folder: Path, plugin_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Copy the device code and the registration into folder/plugins; the manifest entry of every plugin used."""
    if not plugin_ids:
        return {}
    device = build.device_code()
    (folder / PLUGIN_DIR).mkdir(exist_ok=True)
    files = []
    for src in [device.ptx, *device.cubins.values(), REGISTRATION, LAUNCH]:
        shutil.copyfile(src, folder / PLUGIN_DIR / src.name)
        files.append(f"{PLUGIN_DIR}/{src.name}")
    digests = {name: sha256_file(folder / name) for name in files}
    nvcc_version = build.tool_version(build.nvcc()).splitlines()[-1]
    isa = driver.ptx_isa(device.ptx.read_text())
    entries = {}
    for plugin_id in sorted(set(plugin_ids)):
        spec = BY_NAME[plugin_id.split("::", 1)[1]]
        entries[plugin_id] = {
            "name": spec.name, "version": spec.version, "namespace": NAMESPACE, "kernel": spec.kernel,
            "attributes": list(spec.attributes), "architectures": list(build.ARCHS), "ptx_target": build.PTX_ARCH,
            "ptx_isa": isa, "ptx_driver": f"an NVIDIA driver {driver.needs(isa)} JIT-compiles the PTX (ISA {isa}); "
                                          "the cubins need none",
            "ptx": f"{PLUGIN_DIR}/{device.ptx.name}", "cubins": {a: f"{PLUGIN_DIR}/{p.name}" for a, p in device.cubins.items()},
            "registration": f"{PLUGIN_DIR}/{REGISTRATION.name}", "sha256": digests,
            "sources_sha256": build.source_digest(), "nvcc": nvcc_version, "why": spec.why,
        }
    return entries


def check_plugins(bundle: Path, plugins: dict[str, dict[str, Any]]) -> None:
    """Every plugin file is present with the digest the manifest recorded."""
    for plugin_id, entry in sorted(plugins.items()):
        for name, digest in entry["sha256"].items():
            path = bundle / name
            if not path.is_file() or sha256_file(path) != digest:
                raise UserError(f"plugin {plugin_id}: {name} is missing or modified since compile; recompile the "
                                f"bundle (mmtrt compile) to rewrite it")


def register_plugins(bundle: Path, plugins: dict[str, dict[str, Any]], trt=None, parsing: bool = True) -> None:
    """Check the files, then register the plugins with TensorRT: TensorRT 11 imports the bundle's registration module
    (AOT plugins, tensorrt.plugin) once per process; TensorRT-RTX (`trt` is the tensorrt_rtx module) takes
    mmtrt.kernels.rtx's creators, whose kernels come from the bundle's PTX at run time (`parsing` False: only
    engines are deserialized, so its ONNX parser's library is not needed)."""
    check_plugins(bundle, plugins)
    if plugins and trt is not None and trt.__name__ == "tensorrt_rtx":
        from mmtrt.kernels import rtx

        rtx.register(trt, bundle / next(iter(plugins.values()))["ptx"], parsing)
        return
    for path in sorted({entry["registration"] for entry in plugins.values()}):
        _import_registration(bundle, path, plugins)


def _import_registration(bundle: Path, path: str, plugins: dict[str, dict[str, Any]]) -> None:
    """tensorrt.plugin keeps one definition of a plugin per process and raises ValueError ("already has a
    definition") on a second: a registration of the same files is done already; one of other files cannot be."""
    build_key = json.dumps(sorted({name: digest for e in plugins.values() for name, digest in e["sha256"].items()}.items()))
    if _REGISTERED.get("key") == build_key:
        return
    if _REGISTERED:
        raise UserError(f"mmtrt's plugins from another build ({_REGISTERED['bundle']}) are registered in this process "
                        f"and TensorRT keeps one definition per plugin; build {bundle}'s engines in a process of its own")
    spec = importlib.util.spec_from_file_location(f"mmtrt_bundle_plugins_{abs(hash(str(bundle)))}", bundle / path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ValueError as exc:
        if "already has a defin" not in str(exc):  # tensorrt.plugin spells it "defintion"
            raise
        raise UserError(f"mmtrt's plugins are already defined in this process by code other than {bundle}'s "
                        f"registration ({exc}); build its engines in a process of its own") from None
    _REGISTERED.update(key=build_key, bundle=str(bundle))
