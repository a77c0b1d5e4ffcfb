"""The bundle manifest: what is in a bundle and the sha256 of every artifact."""

from __future__ import annotations

import hashlib
import json
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from mmtrt.errors import UserError

SCHEMA_VERSION = 2  # 2: partitions plan for the target (`planned`), engine plans list `profiles`
MANIFEST = "manifest.json"
BUILD_REPORT = "build_report.json"
TOOLCHAIN = ("torch", "torchvision", "transformers", "onnx", "onnxruntime-gpu", "onnx-graphsurgeon", "tokenizers")


def toolchain_versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for pkg in TOOLCHAIN:
        try:
            found[pkg] = version(pkg)
        except PackageNotFoundError:
            found[pkg] = "absent"
    return found


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def read_manifest(bundle: Path) -> dict[str, Any]:
    path = Path(bundle) / MANIFEST
    if not path.is_file():
        raise UserError(f"{bundle} is not an mmtrt bundle (no {MANIFEST}); pass the folder `mmtrt compile` wrote")
    manifest = json.loads(path.read_text())
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise UserError(f"{bundle} has manifest schema {manifest.get('schema_version')}, this mmtrt reads "
                        f"{SCHEMA_VERSION}; recompile the recipe with this mmtrt")
    return manifest


def bundle_hash(bundle: Path) -> str:
    """The manifest's sha256: it lists every artifact's hash, so it identifies the whole bundle."""
    return sha256_file(Path(bundle) / MANIFEST)


def verify_artifacts(bundle: Path, manifest: dict[str, Any]) -> list[str]:
    """Artifacts whose content no longer matches the manifest."""
    return [name for name, digest in manifest["artifacts"].items()
            if not (Path(bundle) / name).is_file() or sha256_file(Path(bundle) / name) != digest]
