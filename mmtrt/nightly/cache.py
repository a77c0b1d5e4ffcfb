"""The build cache: one folder per recipe and cache key, written through the bundle writer's staging folder, so a
killed run leaves only a hidden temporary folder that no lookup sees and the next run sweeps away."""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
from pathlib import Path
from typing import Any

from mmtrt.bundle.manifest import MANIFEST, verify_artifacts
from mmtrt.bundle.writer import staging_folder
from mmtrt.compiler import compile_recipe
from mmtrt.errors import UserError

BUNDLE = "bundle"
INPUTS = "inputs.json"
RECIPE = "recipe.yaml"
KEY_CHARS = 24
SCRATCH = ".determinism-"  # fresh compiles that check a cache hit


class BuildCache:
    def __init__(self, root: Path):
        self.root = Path(root)

    def entry(self, name: str, key: str) -> Path:
        return self.root / name / key[:KEY_CHARS]

    def lookup(self, name: str, key: str) -> Path | None:
        """The cached bundle, when its entry is complete and every artifact still matches the manifest."""
        entry = self.entry(name, key)
        bundle = entry / BUNDLE
        if not (entry / INPUTS).is_file() or not (bundle / MANIFEST).is_file():
            return None
        manifest = json.loads((bundle / MANIFEST).read_text())
        return None if verify_artifacts(bundle, manifest) else bundle

    def build(self, name: str, key: str, recipe_text: str, inputs: dict[str, Any]) -> Path:
        """Compile into a staging folder; only a finished entry is renamed into place (replacing a damaged one)."""
        entry = self.entry(name, key)
        with staging_folder(entry, force=True) as tmp:
            compile_into(tmp, recipe_text)
            (tmp / INPUTS).write_text(json.dumps(inputs, indent=2, sort_keys=True) + "\n")
            tmp.chmod(0o755)  # mkdtemp makes it owner-only; a cached bundle is read by others
        return entry / BUNDLE

    @contextlib.contextmanager
    def locked(self):
        """One run per cache folder at a time; the lock dies with its process, so a killed run never blocks."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UserError(f"another nightly run is using the cache {self.root}; wait for it or set another "
                                "`cache:`") from None
            self.sweep()
            yield self

    def sweep(self) -> list[Path]:
        """Remove the staging folders of runs that were killed (only called while holding the lock)."""
        stale = [p for p in [*self.root.glob("*/.*"), *self.root.glob(f"{SCRATCH}*")]
                 if p.is_dir() and (".tmp-" in p.name or ".old-" in p.name or p.name.startswith(SCRATCH))]
        for p in stale:
            shutil.rmtree(p, ignore_errors=True)
        return stale


def compile_into(folder: Path, recipe_text: str) -> Path:
    """Compile the recipe text into `folder`/bundle, keeping the recipe beside it."""
    (folder / RECIPE).write_text(recipe_text)
    return compile_recipe(folder / RECIPE, folder / BUNDLE)
