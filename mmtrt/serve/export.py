"""`mmtrt export triton BUNDLE REPO`: a Triton model repository that a stock `tritonserver` serves.

REPO/<model>/config.pbtxt   Python backend, decoupled, Triton's batching off (the serving loop batches)
REPO/<model>/1/model.py     mmtrt/serve/triton_repository_model.py: starts the serving loop in a worker process
REPO/<model>/1/bundle/      a copy of the bundle, checked against its manifest first

The model folder is written beside its final place and renamed into it, so a failed export leaves nothing.
Each replica (a server, a pod) loads its own copy of the loop: scale out behind a load balancer.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from mmtrt.errors import UserError
from mmtrt.serve import triton_io
from mmtrt.serve.server import model_name

MODEL_FILE = Path(__file__).with_name("triton_repository_model.py")


def config_pbtxt(name: str, max_batch: int | None, max_queue: int, allow_images: Path | None) -> str:
    params = {"mmtrt_python": sys.executable, "max_queue": str(max_queue),
              "max_batch": str(max_batch or ""), "allow_images": str(allow_images.resolve()) if allow_images else ""}
    lines = [f'name: "{name}"', 'backend: "python"', "max_batch_size: 0",
             "model_transaction_policy { decoupled: true }", "instance_group [ { count: 1 kind: KIND_CPU } ]"]
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    return ("\n".join(lines) + "\n" + triton_io.pbtxt_tensors("input", triton_io.INPUTS)
            + triton_io.pbtxt_tensors("output", triton_io.OUTPUTS))


def export_triton(bundle: Path, repository: Path, max_batch: int | None = None, max_queue: int = 64,
                  allow_images: Path | None = None, force: bool = False) -> Path:
    from mmtrt.bundle.manifest import read_manifest
    from mmtrt.bundle.verify import verify_bundle

    bundle = Path(bundle)
    verify_bundle(bundle, read_manifest(bundle), full=True)
    if allow_images is not None and not allow_images.is_dir():
        raise UserError(f"--allow-images {allow_images} is not a folder")
    name = model_name(bundle)
    final = Path(repository) / name
    if final.exists() and not force:
        raise UserError(f"{final} exists; pass --force to replace it, or export into another repository")
    staging = Path(repository) / f".{name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        (staging / "1").mkdir(parents=True)
        (staging / "config.pbtxt").write_text(config_pbtxt(name, max_batch, max_queue, allow_images))
        shutil.copyfile(MODEL_FILE, staging / "1" / "model.py")
        shutil.copytree(bundle, staging / "1" / "bundle")
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
