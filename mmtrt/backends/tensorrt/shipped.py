"""Engines built at compile time (recipe `output.engines`), so a bundle ships with its portable engines.

Only TensorRT-RTX builds without the target GPU, so `rtx` is the one target a compile can build for anywhere.
The engines go to the staging folder's engines/ after the manifest is written (they are not artifacts: the
bundle's hash stays the portable one) and before the folder is renamed into place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmtrt.backends.tensorrt.flavors import FLAVORS
from mmtrt.errors import UserError
from mmtrt.progress import stage


def check_engine_targets(targets: list[str]) -> None:
    """At plan time: every requested target's TensorRT imports here."""
    from mmtrt.backends.tensorrt.build import import_flavor

    for name in targets:
        try:
            import_flavor(FLAVORS[name])
        except UserError as exc:
            raise UserError(f"output.engines: [{name}]: {exc}") from None


def ship_engines(folder: Path, targets: list[str]) -> list[dict[str, Any]]:
    """Build every TensorRT segment for each target into `folder`; the records. A segment the parser or the
    builder refuses fails the compile with their words; one that cannot be built at all is only recorded."""
    from mmtrt.backends.tensorrt.build import build_engines

    records = []
    for name in targets:
        with stage(f"building {FLAVORS[name].module} engines"):
            records += build_engines(folder, target=name, log=lambda line: None)
    failed = [r for r in records if r["status"] == "failed"]
    if failed:
        raise UserError("output.engines: " + "; ".join(f"{r['segment']} ({r['flavor']}) failed to {r['stage']}: "
                                                        f"{r['reason']}" for r in failed))
    return [{k: r[k] for k in ("segment", "flavor", "status", "file", "reason", "build_seconds") if k in r}
            for r in records]
