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
REQUIRED = {"artifacts": dict, "components": dict, "model": dict, "dims": dict, "envelope": dict}
TOOLCHAIN = ("torch", "torchvision", "transformers", "onnx", "onnxruntime-gpu", "onnx-graphsurgeon", "tokenizers")


def package_versions(packages) -> dict[str, str]:
    """Installed version per package, "absent" where it is not installed."""
    found = {}
    for pkg in packages:
        try:
            found[pkg] = version(pkg)
        except PackageNotFoundError:
            found[pkg] = "absent"
    return found


def toolchain_versions() -> dict[str, str]:
    return {"python": platform.python_version(), **package_versions(TOOLCHAIN)}


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
    manifest = _manifest_json(bundle)
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise UserError(f"{bundle} has manifest schema {manifest.get('schema_version')}, this mmtrt reads "
                        f"{SCHEMA_VERSION}; recompile the recipe with this mmtrt")
    missing = [k for k, kind in REQUIRED.items() if not isinstance(manifest.get(k), kind)]
    if missing or not all(isinstance(k, str) and isinstance(v, str) for k, v in manifest["artifacts"].items()):
        raise UserError(f"{path} lacks {', '.join(missing) or 'artifact hashes'} or has the wrong type there; "
                        "recompile the recipe or restore the bundle")
    return manifest


def _manifest_json(bundle: Path) -> dict[str, Any]:
    path = Path(bundle) / MANIFEST
    if not path.is_file():
        raise UserError(f"{bundle} is not an mmtrt bundle (no {MANIFEST}); pass the folder `mmtrt compile` wrote")
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path} ({exc}); recompile the recipe or restore the bundle") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{path} is not a manifest (a JSON object); recompile the recipe or restore the bundle")
    return manifest


def is_bundle(folder: Path) -> bool:
    """Whether `folder` holds a manifest mmtrt wrote, of any schema version (what `compile --force` may replace)."""
    try:
        manifest = _manifest_json(folder)
    except UserError:
        return False
    return "schema_version" in manifest and isinstance(manifest.get("artifacts"), dict)


def read_build_report(bundle: Path) -> dict[str, Any] | None:
    """The build report (compile time, host), or None without one; it is not hashed, so it is checked here."""
    path = Path(bundle) / BUILD_REPORT
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path} ({exc}); delete it (it only records the compile) or recompile") from None


def bundle_hash(bundle: Path) -> str:
    """The manifest's sha256: it lists every artifact's hash, so it identifies the whole bundle."""
    return sha256_file(Path(bundle) / MANIFEST)


def verify_artifacts(bundle: Path, manifest: dict[str, Any]) -> list[str]:
    """Artifacts whose content no longer matches the manifest."""
    return [name for name, digest in manifest["artifacts"].items()
            if not (Path(bundle) / name).is_file() or sha256_file(Path(bundle) / name) != digest]


def image_side(manifest: dict) -> int:
    """The side of the square images the bundle's preprocessing makes (the digits suites draw their pages at it)."""
    return manifest["components"]["preprocess"]["outputs"][0]["shape"][-1]
