"""The PyTorch model a bundle was compiled from, for the parity suite."""

from __future__ import annotations

from pathlib import Path

from mmtrt.errors import UserError
from mmtrt.ir.frontend import load_source
from mmtrt.progress import quiet_libraries
from mmtrt.recipe import ModelSource


def source_model(manifest: dict, override: Path | None = None):
    """Zoo sources rebuild from the recipe; checkpoint sources need the folder, since bundles travel."""
    quiet_libraries()
    source = ModelSource.model_validate(manifest["recipe"]["model"])
    if source.source == "hf":
        if override is None:
            raise UserError(f"this bundle was compiled from the checkpoint {source.path}; pass --source-model FOLDER")
        source = ModelSource(source="hf", path=str(Path(override).resolve()))
    return load_source(source, Path.cwd())
