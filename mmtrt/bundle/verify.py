"""Check every artifact of a bundle against the sha256 in its manifest before anything runs it.

Hashing every byte costs about 1 s per 700 MB here (docs/results/verify.md), so a file hashed once is
afterwards recognised by its identity: device, inode, size, mtime and ctime, in nanoseconds. Any write through
the file system moves mtime and ctime; mtime can be set back (`touch -r`, `os.utime`), but ctime cannot: the
kernel sets it to now on every write and on every utime. So a changed file, even with its mtime restored, is
hashed again. A copied or moved bundle gets new inodes and is hashed again. What the identity cannot see is a
change under the file system (a bit flipped on the disk, an image edited offline): `mmtrt verify BUNDLE` and
MMTRT_VERIFY=full hash every byte.

The record of verified files lives in the user's cache folder (MMTRT_CACHE, else XDG_CACHE_HOME/mmtrt, else
~/.cache/mmtrt), never in the bundle: a bundle is read-only where it is deployed, and its files are hashed. An
unwritable cache only costs the full hash on every load.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from mmtrt.bundle.manifest import bundle_hash, sha256_file
from mmtrt.errors import UserError

RECORD_VERSION = 1


def verify_bundle(bundle: str | Path, manifest: dict[str, Any], full: bool | None = None) -> None:
    """Raise UserError naming every artifact that is missing or differs from the manifest. `full` hashes every
    file even when the record says it is unchanged (default: MMTRT_VERIFY=full)."""
    bundle = Path(bundle).resolve()
    full = os.environ.get("MMTRT_VERIFY") == "full" if full is None else full
    record = _record_path(bundle)
    known = {} if full else _read_record(record)
    verified, missing, changed = {}, [], []
    for name, digest in sorted(manifest["artifacts"].items()):
        path = _inside(bundle, name)
        try:
            identity = [digest, *_identity(path)]
        except OSError:
            missing.append(name)
            continue
        if known.get(name) != identity and sha256_file(path) != digest:
            changed.append(name)
            continue
        verified[name] = identity
    if missing or changed:
        raise UserError(_problem(bundle, missing, changed))
    if verified != known:
        _write_record(record, verified)


def _inside(bundle: Path, name: str) -> Path:
    path = (bundle / name).resolve()
    if not path.is_relative_to(bundle):
        raise UserError(f"{bundle}/manifest.json lists artifact {name!r} outside the bundle; recompile the recipe")
    return path


def _identity(path: Path) -> list[int]:
    st = path.stat()
    if not path.is_file():
        raise IsADirectoryError(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _problem(bundle: Path, missing: list[str], changed: list[str]) -> str:
    parts = ([f"{', '.join(missing)} missing"] if missing else []) + (
        [f"{', '.join(changed)} changed since compile (sha256 differs from the manifest)"] if changed else [])
    return f"bundle {bundle}: {'; '.join(parts)}; restore the bundle or recompile the recipe"


def cache_folder() -> Path:
    if os.environ.get("MMTRT_CACHE"):
        return Path(os.environ["MMTRT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mmtrt"


def _record_path(bundle: Path) -> Path:
    """One record per bundle folder and manifest: a recompiled bundle at the same path starts afresh."""
    key = hashlib.sha256(f"{bundle}\0{bundle_hash(bundle)}".encode()).hexdigest()
    return cache_folder() / "verified" / f"{key}.json"


def _read_record(path: Path) -> dict[str, list]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    ok = isinstance(record, dict) and record.get("version") == RECORD_VERSION and isinstance(record.get("files"), dict)
    return record["files"] if ok else {}


def _write_record(path: Path, files: dict[str, list]) -> None:
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
            json.dump({"version": RECORD_VERSION, "files": files}, f)
        os.replace(f.name, path)
