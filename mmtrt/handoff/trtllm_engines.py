"""TensorRT-LLM engines: built from the bundle's checkpoint by the planned `trtllm-build`, kept in BUNDLE/engines.

An engine holds the checkpoint's weights compiled for one GPU and one TensorRT-LLM, with the build options as
limits, so its key is the checkpoint's digest, the build options' digest, the compute capability and the
TensorRT-LLM version; engines/index.json (shared with the TensorRT engines, not part of the bundle's hash) maps
the key to the engine folder (`rank0.engine` + `config.json`, as trtllm-build writes them) and its digest.

TensorRT-LLM lives in an environment of its own (trtllm_process.py): the probe asks its worker, and the command is
that environment's trtllm-build (tensorrt_llm/commands/build.py, NVIDIA/TensorRT-LLM; the `trtllm-build` console
script beside its python, else `python -m tensorrt_llm.commands.build`), with `--input_timing_cache` /
`--output_timing_cache` per target. NOT RUN: TensorRT-LLM cannot be installed where this was written.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from mmtrt.backends.tensorrt.engines import ENGINE_DIR, INDEX, read_index, write_index
from mmtrt.handoff.trtllm_plan import CHECKPOINT_DIR, ENGINE_DIR as PLANNED_ENGINE_DIR, TIMING_CACHE
from mmtrt.handoff.trtllm_process import build_executable, probe, trtllm_python
from mmtrt.bundle.manifest import read_manifest, sha256_file
from mmtrt.errors import UserError

SEGMENT = "llm (tensorrt-llm)"
ENGINE_FILE = "rank0.engine"


@dataclass(frozen=True)
class LlmTarget:
    """What a TensorRT-LLM engine is specific to: the GPU's compute capability and the TensorRT-LLM version."""

    compute_capability: str
    tensorrt_llm: str

    def tag(self) -> str:
        return f"sm{self.compute_capability.replace('.', '')}-trtllm{self.tensorrt_llm}"


def probe_llm_target() -> LlmTarget | str:
    """This host's target, or why it cannot build or run TensorRT-LLM engines, from the worker's environment."""
    found = probe(trtllm_python())
    return found if isinstance(found, str) else LlmTarget(*found)


def checkpoint_digest(manifest: dict[str, Any]) -> str:
    """The digest of the checkpoint's files, from the manifest's artifact hashes (verified at load)."""
    files = {k: v for k, v in manifest["artifacts"].items() if k.startswith(f"{CHECKPOINT_DIR}/")}
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def options_digest(plan: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(plan["build_options"], sort_keys=True).encode()).hexdigest()[:12]


def llm_engine_key(manifest: dict[str, Any], target: LlmTarget) -> str:
    return f"llm-{checkpoint_digest(manifest)[:16]}-{options_digest(manifest['tensorrt_llm'])}-{target.tag()}"


def llm_engine_dir(manifest: dict[str, Any], target: LlmTarget) -> str:
    return f"{ENGINE_DIR}/trtllm-{llm_engine_key(manifest, target)}"


def build_command(bundle: Path, plan: dict[str, Any], output_dir: Path, target: LlmTarget) -> list[str]:
    """The planned trtllm-build command for this bundle and host: the real checkpoint folder, `output_dir`, and
    a timing cache per target (tactic timings hold only on the GPU and version that measured them)."""
    cache = str(bundle / f"{ENGINE_DIR}/timing-{target.tag()}.trtllm.cache")
    words = shlex.split(plan["command"])
    swap = {f"BUNDLE/{CHECKPOINT_DIR}": str(bundle / CHECKPOINT_DIR), f"BUNDLE/{PLANNED_ENGINE_DIR}": str(output_dir),
            f"BUNDLE/{TIMING_CACHE}": cache}
    words = [swap.get(w, w) for w in words]
    return build_executable(trtllm_python()) + words[1:]


def bundle_reason(manifest: dict[str, Any]) -> str | None:
    """Why this bundle has no TensorRT-LLM engine to build on any host, or None."""
    plan = manifest.get("tensorrt_llm")
    if plan is None:
        return "partition.llm does not list tensorrt-llm"
    return plan["checkpoint_missing"] if plan["checkpoint"] is None else None


def skip_reason(manifest: dict[str, Any], target: LlmTarget | str) -> str | None:
    """Why this bundle's TensorRT-LLM engine cannot be built or run here, or None."""
    return bundle_reason(manifest) or (target if isinstance(target, str) else None)


def build_llm_engine(bundle: str | Path, force: bool = False, log: Callable[[str], None] = print,
                     target: LlmTarget | str | None = None) -> dict[str, Any]:
    """Run the planned trtllm-build when this host can; a record: built, up to date, or skipped with the reason."""
    bundle = Path(bundle)
    manifest = read_manifest(bundle)
    target = probe_llm_target() if target is None else target
    why = skip_reason(manifest, target)
    if why is not None:
        log(f"{SEGMENT}: skipped, {why}")
        return {"segment": SEGMENT, "status": "skipped", "reason": why}
    key, rel = llm_engine_key(manifest, target), llm_engine_dir(manifest, target)
    index = read_index(bundle)
    engine = bundle / rel / ENGINE_FILE
    if not force and key in index and engine.is_file() and sha256_file(engine) == index[key]["sha256"]:
        log(f"{SEGMENT}: up to date ({rel})")
        return {"segment": SEGMENT, "status": "up to date", "key": key, "file": rel}
    started = time.perf_counter()
    (bundle / ENGINE_DIR).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=bundle / ENGINE_DIR, prefix=".trtllm-") as tmp:
        command = build_command(bundle, manifest["tensorrt_llm"], Path(tmp), target)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not (Path(tmp) / ENGINE_FILE).is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise UserError(f"trtllm-build failed (exit {done.returncode}: {tail[0]}); rerun `{shlex.join(command)}` "
                            "to see its whole log")
        shutil.rmtree(bundle / rel, ignore_errors=True)
        Path(tmp).rename(bundle / rel)  # a killed build leaves only a hidden temporary folder
    seconds = round(time.perf_counter() - started, 2)
    record = {"segment": SEGMENT, "file": rel, "sha256": sha256_file(engine), "target": target.tag(),
              "tensorrt_llm": target.tensorrt_llm, "compute_capability": target.compute_capability,
              "build_seconds": seconds, "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    index[key] = record
    write_index(bundle, index)
    log(f"{SEGMENT}: built {rel} in {seconds} s")
    return {**record, "status": "built", "key": key}


def select_llm_engine(bundle: Path, manifest: dict[str, Any], target: LlmTarget | str,
                      index: dict[str, dict]) -> tuple[Path | None, str]:
    """The engine folder that runs the LLM through TensorRT-LLM on this host, or None and why not."""
    why = skip_reason(manifest, target)
    if why is not None:
        return None, why
    record = index.get(llm_engine_key(manifest, target))
    if record is None:
        built = sorted(r["target"] for r in index.values() if r.get("segment") == SEGMENT)
        others = f" (built for: {', '.join(built)})" if built else ""
        return None, (f"no TensorRT-LLM engine matches this checkpoint, build options and {target.tag()}{others}; "
                      "run `mmtrt build-engines BUNDLE` on this host")
    engine = Path(bundle) / record["file"] / ENGINE_FILE
    if not engine.is_file() or sha256_file(engine) != record["sha256"]:
        return None, f"engine {record['file']} is missing or modified; run `mmtrt build-engines BUNDLE --force`"
    return engine.parent, f"engine {record['file']}"


def plan_json(bundle: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """What `build-engines --plan` shows of the TensorRT-LLM step on this host: the command, the key, or the skip."""
    plan = manifest.get("tensorrt_llm")
    if plan is None:
        return None
    target = probe_llm_target()
    why = skip_reason(manifest, target)
    if why is not None:
        return {"command": plan["command"], "skipped": why, "index": INDEX}
    rel = llm_engine_dir(manifest, target)
    return {"command": shlex.join(build_command(bundle, plan, bundle / rel, target)),
            "key": llm_engine_key(manifest, target), "engine": rel, "index": INDEX}
