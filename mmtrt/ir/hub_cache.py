"""`model.path` may name a Hugging Face Hub model (`llava-hf/llava-1.5-7b-hf`): it is looked up in the local
Hugging Face cache only. mmtrt never downloads: a compile is reproducible from what is on the disk."""

from __future__ import annotations

import re
from pathlib import Path

from mmtrt.errors import UserError

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def checkpoint_folder(path: str, recipe_dir: Path) -> Path:
    """The folder `path` names (relative to the recipe), or, when there is none and `path` reads as a Hub id,
    that model's snapshot in the local Hugging Face cache."""
    folder = recipe_dir / path
    if folder.exists() or not HUB_ID.fullmatch(path):
        return folder
    snapshot = cached_snapshot(path)
    if snapshot is None:
        from huggingface_hub import constants

        raise UserError(f"model.path {path} is no folder, and the local Hugging Face cache ({constants.HF_HUB_CACHE}) "
                        f"holds no snapshot of it; mmtrt never downloads: fetch it with `hf download {path}`, or set "
                        f"model.path to a folder written by save_pretrained")
    return snapshot


def cached_snapshot(repo_id: str) -> Path | None:
    """The snapshot folder of `repo_id`'s main revision in the local cache, if it is a Hub id that is there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (HFValidationError, LocalEntryNotFoundError):
        return None
