"""What the GPU check carries to the lent machine, and whether it will run there: `prepare` builds the payload on a
CPU host (the plugins' PTX and cubins and the CPU twin in .gpu_check/kernels, the wheels the image lacks in
.gpu_check/wheels, a payload.json naming the commit and every file); `check_payload` and `check_imports` are the
dry run's checks: the working tree plus the payload within the 64 MiB a device call carries, and every module the
check imports on the GPU host found in the image's package list (scripts/gpu_image_packages.txt), the carried
wheels or Python's standard library.

The import check follows every import of the check's own scripts, and the module-level imports of the mmtrt and
passes modules they reach (what must import for a step to start); the imports mmtrt makes lazily sit behind
optional features, and a step that reaches a missing one fails with its reason in the report.
"""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = ROOT / ".gpu_check"
LIMIT = 64 * 2**20  # bytes one device call carries: the working tree, shared/ and the carried paths
# For `mmtrt compile` (pydantic: the recipe's schema; onnx-graphsurgeon: the IR's rewrites), Python 3.12 builds,
# the versions of the project's environment.
WHEELS = ("pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
          "onnx-graphsurgeon==0.6.1")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# The scripts the GPU host runs, and the modules its subprocesses start from (`python3 -m mmtrt.cli compile`).
SCRIPTS = ("gpu_check.py", "gpu_kernel_check.py", "gpu_roofline.py", "gpu_backend_check.py", "gpu_payload.py",
           "gpu_compile_compare.py")
MODULES = ("mmtrt.cli", "mmtrt.compiler", "mmtrt.runtime", "mmtrt.compare.inputs")
REMOVED_IN_312 = {"distutils", "imp", "asynchat", "asyncore", "smtpd"}
# Imported only after a guard that reports SKIP without them (they are not on the image and cannot travel).
GUARDED = {"tensorrt": "the engines step", "tensorrt_rtx": "the engines step", "polygraphy": "the engines step"}


def prepare() -> dict:
    """Build .gpu_check/ from this tree; returns payload.json's content."""
    sys.path.insert(0, str(ROOT))
    from mmtrt.kernels.build import cpu_twin, device_code

    device, twin = device_code(), cpu_twin()
    kernels = PAYLOAD / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    for src in [device.ptx, *device.cubins.values(), twin]:
        shutil.copyfile(src, kernels / src.name)
    wheels = PAYLOAD / "wheels"
    wanted = {w.split("==")[0].replace("-", "_").lower(): w for w in WHEELS}
    have = {p.name.split("-")[0].lower() for p in wheels.glob("*.whl")}
    missing = [w for name, w in wanted.items() if name not in have]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "-d", str(wheels), *missing]
        for platform in PLATFORMS:
            cmd[-len(missing):-len(missing)] = ["--platform", platform]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode:
            sys.exit(f"gpu_payload: cannot download the wheels {', '.join(missing)} for Python 3.12: "
                     f"{(done.stderr.strip().splitlines() or ['pip failed'])[-1]}")
    files = sorted(p for p in PAYLOAD.rglob("*") if p.is_file() and p.name != "payload.json")
    manifest = {"commit": commit(), "built_by": {"nvcc": device.folder.name, "cpu_twin": twin.parent.name},
                "files": {str(p.relative_to(PAYLOAD)): {"bytes": p.stat().st_size,
                                                       "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                          for p in files}}
    (PAYLOAD / "payload.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def tree_bytes() -> int:
    """Tracked files and untracked ones git does not ignore: what a device call sends besides the carried paths."""
    done = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                          capture_output=True, check=True)
    paths = [ROOT / p for p in done.stdout.decode().split("\0") if p]
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def check_payload() -> tuple[bool, str, dict]:
    if not (PAYLOAD / "payload.json").is_file():
        return False, "no .gpu_check/payload.json: run scripts/gpu_check.sh prepare", {}
    files = json.loads((PAYLOAD / "payload.json").read_text())["files"]
    wrong = [name for name, f in files.items() if not (PAYLOAD / name).is_file()
             or hashlib.sha256((PAYLOAD / name).read_bytes()).hexdigest() != f["sha256"]]
    carried = sum(f["bytes"] for f in files.values())
    tree = tree_bytes()
    sizes = {"tree_bytes": tree, "payload_bytes": carried, "total_bytes": tree + carried, "limit_bytes": LIMIT,
             "payload_files": {name: f["bytes"] for name, f in files.items()}}
    ok = not wrong and tree + carried <= LIMIT
    return ok, (f"tree {tree / 2**20:.1f} MiB + .gpu_check {carried / 2**20:.1f} MiB = "
                f"{(tree + carried) / 2**20:.1f} MiB of {LIMIT / 2**20:.0f}"
                + (f"; changed since prepare: {', '.join(wrong)}" if wrong else "")), sizes


def image_modules(path: Path) -> set[str]:
    return {line.split()[1] for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def wheel_modules(folder: Path = PAYLOAD / "wheels") -> set[str]:
    """The top-level modules the carried wheels install."""
    found = set()
    for wheel in folder.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                top = name.split("/")[0]
                if not top.endswith((".dist-info", ".data")):
                    found.add(top.split(".")[0])
    return found


def _imports(path: Path, module_level_only: bool) -> set[tuple[str, int]]:
    """(absolute module name, level) of every import in a file (level > 0 for relative imports)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = list(ast.walk(tree))
    if module_level_only:  # imports in module-level try/if blocks run at import too, those in functions later
        functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        nodes = [n for top in tree.body if not isinstance(top, functions) for n in ast.walk(top)]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {(a.name, 0) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add((node.module, 0))
            found |= {(f"{node.module}.{a.name}", 0) for a in node.names}
    return found


def _local_file(name: str) -> Path | None:
    parts = name.split(".")
    for base in (ROOT, ROOT / "scripts"):
        for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts) / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def import_closure() -> tuple[set[str], list[str]]:
    """(third-party and standard top-level modules, local files reached) of the scripts and MODULES."""
    queue = [(ROOT / "scripts" / s, False) for s in SCRIPTS] + [(_local_file(m), True) for m in MODULES]
    seen, outside = set(), set()
    while queue:
        path, module_level = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        for name, _ in _imports(path, module_level):
            local = _local_file(name)
            parents = [_local_file(".".join(name.split(".")[:i])) for i in range(1, name.count(".") + 1)]
            if local is not None or any(parents):
                queue += [(p, True) for p in [*parents, local] if p is not None]
            elif name.split(".")[0] not in {"mmtrt", "passes"}:
                outside.add(name.split(".")[0])
    return outside, sorted(str(p.relative_to(ROOT)) for p in seen)


def check_imports(packages: Path = ROOT / "scripts" / "gpu_image_packages.txt") -> tuple[bool, str, dict]:
    outside, files = import_closure()
    stdlib = set(sys.stdlib_module_names) - REMOVED_IN_312  # the image's Python is 3.12
    known = image_modules(packages) | wheel_modules() | stdlib | {"__future__"}
    missing = sorted(outside - known - set(GUARDED))
    guarded = sorted(outside & set(GUARDED))
    detail = (f"{len(outside)} top-level modules from {len(files)} files: "
              + (f"missing on the image and not carried: {', '.join(missing)}" if missing else
                 "each on the image's list, in a carried wheel or in the standard library")
              + (f"; imported behind a SKIP guard: {', '.join(guarded)}" if guarded else ""))
    return not missing, detail, {"modules": sorted(outside), "missing": missing, "guarded": guarded}


if __name__ == "__main__":
    print(json.dumps(prepare(), indent=1))
