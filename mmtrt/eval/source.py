"""The PyTorch model a bundle was compiled from, for the parity suite."""

from __future__ import annotations

from pathlib import Path

from mmtrt.errors import UserError
from mmtrt.ir.frontend import load_source
from mmtrt.ir.hub_cache import cached_snapshot
from mmtrt.progress import quiet_libraries, stage
from mmtrt.recipe import ModelSource


def source_model(manifest: dict, override: Path | None = None, own_dtype: bool = False):
    """Zoo sources rebuild from the recipe, Hub ids from the local Hugging Face cache; checkpoint folders must be
    named, since bundles travel. `own_dtype`: in the checkpoint's dtype, as the compiler loads it
    (`frontend.load_source`), else float32."""
    quiet_libraries()
    source = ModelSource.model_validate(manifest["recipe"]["model"])
    if source.source == "hf" and (override or not cached_snapshot(source.path)):
        if override is None:
            raise UserError(f"this bundle was compiled from the checkpoint {source.path}; pass --source-model FOLDER")
        source = ModelSource(source="hf", path=str(Path(override).resolve()))
    with stage("loading the PyTorch model the bundle was compiled from"):
        return load_source(source, Path.cwd(), own_dtype)
