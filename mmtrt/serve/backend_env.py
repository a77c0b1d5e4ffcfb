"""The environment Triton's Python backend stub runs in, so that PyTriton's tritonserver works beside our stack.

Two facts of nvidia-pytriton 0.7.0 (Triton 2.51) on a machine like ours:
- the stub links `libpython3.X.so.1.0` by name; the system's copy can be older than the interpreter we run, and
  model load then fails (`'_thread.RLock' object has no attribute '_recursion_count'`). The running interpreter's
  own library folder goes first on the server's LD_LIBRARY_PATH.
- the stub was built against numpy 1.x: with numpy 2 in its environment every output tensor arrives empty. mmtrt
  needs numpy 2, so the stub gets an environment of its own: a virtual environment of this interpreter holding
  numpy<2, which then reads the rest (pytriton, pyzmq) from ours through a .pth file.

`python -m mmtrt.serve.backend_env` prepares it (the Makefile's install step does); `mmtrt serve` prepares it on
first use.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

from mmtrt.errors import UserError

STUB_NUMPY = "numpy>=1.26,<2"


def env_folder() -> Path:
    """Where the stub's environment lives: `MMTRT_TRITON_PYTHON_ENV`, else beside this interpreter's environment."""
    return Path(os.environ.get("MMTRT_TRITON_PYTHON_ENV") or Path(sys.prefix) / "triton-python-env")


def needs_own_env() -> bool:
    import numpy

    return int(numpy.__version__.split(".")[0]) >= 2


def site_packages(prefix: Path) -> Path:
    return prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def prepare(folder: Path | None = None, quiet: bool = False) -> Path:
    """The stub's environment, made when missing (a virtual environment, numpy<2 from the package index)."""
    if not needs_own_env():
        return Path(sys.exec_prefix)
    folder = folder or env_folder()
    marker = folder / ".mmtrt-ready"
    if marker.exists():
        return folder
    if not quiet:
        print(f"mmtrt: preparing the Triton Python backend's environment in {folder} (numpy<2, once)", file=sys.stderr)
    staging = folder.with_name(f"{folder.name}.partial-{os.getpid()}")  # renamed into place: servers may race
    venv.EnvBuilder(clear=True, with_pip=False, symlinks=True).create(staging)
    target = site_packages(staging)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-deps", "--target", str(target), STUB_NUMPY], capture_output=True, text=True)
    if done.returncode:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"could not install {STUB_NUMPY} for Triton's Python backend "
                        f"({done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'pip failed'}); "
                        "run `python -m mmtrt.serve.backend_env` where the package index is reachable")
    (target / "mmtrt-main-env.pth").write_text("".join(p + "\n" for p in site.getsitepackages()))
    (staging / ".mmtrt-ready").write_text(STUB_NUMPY + "\n")
    if folder.exists() and not marker.exists():  # left half-made by an older version or a crash
        shutil.rmtree(folder)
    try:
        staging.rename(folder)
    except OSError:  # another process made it first
        shutil.rmtree(staging, ignore_errors=True)
        if not marker.exists():
            raise
    return folder


def server_environment(stub_env: Path) -> dict[str, str]:
    """What the tritonserver process needs in its environment beside ours: this interpreter's libpython first,
    and the stub's environment first on PATH (the stub finds its Python environment through `python3` there)."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    paths = [p for p in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p]
    return {"LD_LIBRARY_PATH": ":".join(paths), "PATH": f"{stub_env / 'bin'}:{os.environ.get('PATH', '')}"}


if __name__ == "__main__":
    print(prepare())
