"""The GPU check's steps, in order, each with a time budget that keeps the whole run under 8 minutes, and one JSON
report ($OUT/gpu_check.json, else out/gpu_check/report.json). A step is PASS, FAIL or SKIP (what it needs is not on
this host: the reason says what); the exit code is 1 when a step failed. It runs with the image's python3 and what
.gpu_check/ carries (scripts/gpu_payload.py builds it); `--dry` runs each step's host side on a CPU host, no GPU:
the payload's size, every import found on the image, every script parses, every kernel in the PTX and cubins.

  env           the GPU, its driver, and the driver the PTX needs (its ISA)
  kernels       every plugin kernel through CuPy, from the cubin and from the PTX, against the CPU twin
  memcheck      compute-sanitizer's memcheck on the quick kernel cases
  racecheck     compute-sanitizer's racecheck (shared memory) on the same
  ncu           Nsight Compute's time per kernel against docs/results/plugin-roofline.md
  ort-cuda      a static bundle on ONNX Runtime's CUDA provider (needs onnxruntime-gpu)
  engines       TensorRT engines against ONNX Runtime (needs TensorRT, or TensorRT-RTX and one of its GPUs)
  compile-cuda  `mmtrt compile --device cuda` against the CPU compile's bundle
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
import gpu_payload  # noqa: E402
import gpu_roofline  # noqa: E402
from mmtrt.kernels import driver  # noqa: E402  (standard library only)

KERNELS = gpu_payload.PAYLOAD / "kernels"
WORK = Path("/tmp/gpu_check")
BUDGET_S = {"env": 10, "kernels": 110, "memcheck": 70, "racecheck": 90, "ncu": 70, "ort-cuda": 5, "engines": 5,
            "compile-cuda": 110,
            # beyond the 8 minutes: only where the backend is installed (never on the lent machine's image)
            "ort-cuda+": 150, "engines+": 300}


class Run:
    def __init__(self, python: str, dry: bool):
        self.python, self.dry, self.deadline = python, dry, None

    def begin(self, step: str) -> None:
        """Start a step's clock: its subprocesses share its budget (the extended one where its backend is here)."""
        self.deadline = time.monotonic() + BUDGET_S.get(f"{step}+", BUDGET_S.get(step, 60))

    def sub(self, cmd: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
        """cmd within what is left of the step's budget (subprocess.TimeoutExpired past it)."""
        env = {**os.environ, "MMTRT_KERNEL_TWIN": str(KERNELS / "libmmtrt_kernels_cpu.so"), "PYTHONUNBUFFERED": "1"}
        left = max(1.0, self.deadline - time.monotonic())
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=left, env=env)


def ptx_isa() -> str:
    return driver.ptx_isa((KERNELS / "kernels.ptx").read_text())


def step_env(run: Run):
    isa = ptx_isa()
    if run.dry:
        return "PASS", f"PTX ISA {isa}: needs an NVIDIA driver {driver.needs(isa)} (not read: dry run)", {}
    query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=BUDGET_S["env"])
    name, version, cc = [c.strip() for c in query.stdout.splitlines()[0].split(",")]
    why = driver.reason(isa, version)
    facts = {"gpu": name, "driver": version, "compute_capability": cc, "ptx_isa": isa}
    return ("FAIL", why, facts) if why else ("PASS", f"{name}, driver {version}, compute capability {cc}; the PTX "
                                                       f"(ISA {isa}) loads on this driver", facts)


def entries() -> set[str]:
    """Every kernel the plugins launch: the extern "C" entries of kernels.cu."""
    source = (ROOT / "mmtrt" / "kernels" / "csrc" / "kernels.cu").read_text()
    prefixes = re.findall(r"mmtrt_(\w+?)_##SUFFIX", source)
    suffixes = {"TOKEN_SELECT": re.findall(r"^MMTRT_TOKEN_SELECT\((\w+),", source, re.M),
                "INT4_GEMM": re.findall(r"^MMTRT_INT4_GEMM\((\w+),", source, re.M)}
    return {f"mmtrt_{p}_{s}" for p in prefixes for s in suffixes["INT4_GEMM" if p == "int4_gemm" else "TOKEN_SELECT"]}


def step_kernels(run: Run):
    """The cubin with every case and the timings; the PTX (JIT-compiled by the driver) with the quick cases."""
    wanted = entries()
    ptx = set(re.findall(r"\.entry (\w+)\(", (KERNELS / "kernels.ptx").read_text()))
    cubins = sorted(p.name for p in KERNELS.glob("kernels.sm_*.cubin"))
    if wanted - ptx or not wanted or not cubins:
        return "FAIL", f"kernels.cu's entries missing from the PTX: {sorted(wanted - ptx)}; cubins {cubins}", {}
    if run.dry:
        return "PASS", f"{len(wanted)} kernels in the PTX, cubins {', '.join(cubins)} (not launched: dry run)", {}
    tails, ok = {}, True
    for image in ("cubin", "ptx"):
        done = run.sub([run.python, "scripts/gpu_kernel_check.py", "--kernels", str(KERNELS), "--image", image,
                        *(["--quick"] if image == "ptx" else [])])
        tails[image] = done.stdout[-3000:] + done.stderr[-2000:]
        ok &= done.returncode == 0
    cases = sum(t.count("\nok ") + t.startswith("ok ") for t in tails.values())
    return ("PASS" if ok else "FAIL"), f"{len(wanted)} kernels, every case of the cubin and the quick ones of the PTX: " \
           f"{cases} cases within their bounds" if ok else "a case MISMATCHed or a launch failed: see the tails", tails


def step_sanitizer(run: Run, tool: str):
    cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", run.python, "scripts/gpu_kernel_check.py",
           "--kernels", str(KERNELS), "--quick"]
    if run.dry:
        return "PASS", f"would run: {' '.join(cmd[:5])} ... --quick (dry run)", {}
    if shutil.which("compute-sanitizer") is None:
        return "SKIP", "compute-sanitizer is not installed on this host", {}
    done = run.sub(cmd)
    tail = {"tail": done.stdout[-4000:] + done.stderr[-2000:]}
    if done.returncode == 0:
        return "PASS", f"{tool} found no error in the quick case of every kernel and type", tail
    if done.returncode == 3:
        return "FAIL", f"{tool} reported errors: see the tail", tail
    if "MISMATCH" in done.stdout:
        return "FAIL", f"a case MISMATCHed under {tool}", tail
    return "FAIL", f"{tool} could not run the check (exit {done.returncode})", tail


def roofline_order() -> list[str]:
    tree = ast.parse((ROOT / "scripts" / "gpu_kernel_check.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "ROOFLINE")
    return [name for name, _ in ast.literal_eval(node.value)]


def step_ncu(run: Run):
    rows = gpu_roofline.cases()
    if [r["plugin"] for r in rows] != roofline_order():
        return "FAIL", "gpu_kernel_check.py's ROOFLINE cases are not the roofline page's rows, in order", {}
    if run.dry:
        return "PASS", f"{len(rows)} cases read from {gpu_roofline.PAGE.name} with their bounds (not timed: dry run)", {}
    if shutil.which("ncu") is None:
        return "SKIP", "Nsight Compute (ncu) is not installed on this host", {}
    WORK.mkdir(parents=True, exist_ok=True)
    log = WORK / "ncu.csv"
    done = run.sub(gpu_roofline.command(run.python, KERNELS, log))
    if done.returncode or not log.is_file():
        return "FAIL", f"ncu exited {done.returncode}", {"tail": done.stdout[-3000:] + done.stderr[-2000:]}
    per_case = int(re.search(r"ROOFLINE_LAUNCHES = (\d+)", (ROOT / "scripts" / "gpu_kernel_check.py").read_text())[1])
    ok, detail, results = gpu_roofline.judge(rows, gpu_roofline.launches(log.read_text()), per_case)
    return ("PASS" if ok else "FAIL"), detail, {"cases": results}


def step_ort_cuda(run: Run):
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return "SKIP", (f"onnxruntime {onnxruntime.__version__} here has no CUDA provider (it is the CPU package); "
                        "onnxruntime-gpu is far over the 64 MiB a device call carries"), {}
    if run.dry:
        return "PASS", "onnxruntime lists the CUDA provider (not run: dry run)", {}
    bundle = compile_bundle(run, "static", ["--device", "cpu"] if has_device_option(run) else [])
    done = run.sub([run.python, "scripts/gpu_backend_check.py", "ort-cuda", str(bundle)])
    return ("PASS" if done.returncode == 0 else "FAIL"), done.stdout.strip().splitlines()[-1], {"tail": done.stdout[-3000:]}


def step_engines(run: Run):
    if importlib.util.find_spec("tensorrt") is None:
        rtx = "" if importlib.util.find_spec("tensorrt_rtx") is None else "; TensorRT-RTX is, see docs/gpu.md"
        return "SKIP", ("TensorRT is not installed on this host (its libraries come from NVIDIA's package index, "
                        f"which the lent machine cannot reach, and are far over 64 MiB){rtx}"), {}
    if importlib.util.find_spec("polygraphy") is None:
        return "SKIP", "Polygraphy is not installed on this host (pip install polygraphy)", {}
    if run.dry:
        return "PASS", "tensorrt and Polygraphy import (not built: dry run)", {}
    bundle = compile_bundle(run, "engines", [])
    built = run.sub([run.python, "-m", "mmtrt.cli", "build-engines", str(bundle)])
    done = run.sub([run.python, "scripts/gpu_backend_check.py", "engines", str(bundle)])
    ok = built.returncode == 0 and done.returncode == 0
    return ("PASS" if ok else "FAIL"), (done.stdout.strip() or built.stderr.strip() or "no output").splitlines()[-1], \
        {"tail": built.stderr[-2000:] + done.stdout[-3000:]}


def has_device_option(run: Run) -> bool:
    return "--device" in run.sub([run.python, "-m", "mmtrt.cli", "compile", "--help"]).stdout


def compile_bundle(run: Run, name: str, flags: list[str]) -> Path:
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text()
    if name == "static":
        recipe = recipe.replace("\nenvelope:", "\n  - kv_layout: {layout: static}\nenvelope:", 1)
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / f"{name}.yaml").write_text(recipe)
    out = WORK / f"{name}.bundle"
    done = run.sub([run.python, "-m", "mmtrt.cli", "compile", str(WORK / f"{name}.yaml"), "-o", str(out),
                          "--force", *flags])
    if done.returncode:
        raise RuntimeError(f"mmtrt compile {' '.join(flags)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return out


def step_compile_cuda(run: Run):
    if not has_device_option(run):
        return "SKIP", "this tree's `mmtrt compile` has no --device option: the compile's CUDA path is not in it", {}
    import torch

    if not torch.cuda.is_available():
        return ("PASS", "compile --device exists (not compiled: dry run)", {}) if run.dry else \
            ("SKIP", f"torch {torch.__version__} sees no CUDA GPU here", {})
    cpu = compile_bundle(run, "cpu", ["--device", "cpu"])
    cuda = compile_bundle(run, "cuda", ["--device", "cuda"])
    done = run.sub([run.python, "scripts/gpu_compile_compare.py", str(cpu), str(cuda)])
    return ("PASS" if done.returncode == 0 else "FAIL"), (done.stdout.strip() or done.stderr.strip()).splitlines()[-1], \
        {"tail": done.stdout[-3000:] + done.stderr[-2000:]}


def step_dry(run: Run):
    """The dry run's own checks: the payload's size, the imports, and that every script parses."""
    ok_size, size_detail, sizes = gpu_payload.check_payload()
    ok_imports, import_detail, imports = gpu_payload.check_imports()
    parsed = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True).returncode == 0
    for script in gpu_payload.SCRIPTS:
        compile((ROOT / "scripts" / script).read_text(), script, "exec")
    ok = ok_size and ok_imports and parsed
    return ("PASS" if ok else "FAIL"), f"{size_detail}; {import_detail}; gpu_check.sh parses: {parsed}", \
        {"sizes": sizes, "imports": imports}


STEPS = {"env": step_env, "kernels": step_kernels, "memcheck": lambda r: step_sanitizer(r, "memcheck"),
         "racecheck": lambda r: step_sanitizer(r, "racecheck"), "ncu": step_ncu, "ort-cuda": step_ort_cuda,
         "engines": step_engines, "compile-cuda": step_compile_cuda}


def run_step(run: Run, name: str, fn) -> dict:
    start = time.monotonic()
    run.begin(name)
    try:
        status, detail, extra = fn(run)
    except subprocess.TimeoutExpired as exc:
        status, detail, extra = "FAIL", f"past its budget of {exc.timeout:.0f} s", {}
    except Exception as exc:  # a step's failure is its report line, and the other steps still run
        status, detail, extra = "FAIL", f"{type(exc).__name__}: {exc}", {}
    seconds = round(time.monotonic() - start, 1)
    print(f"{status} {name}: {detail} [{seconds} s of {BUDGET_S.get(name, '-')}]", flush=True)
    return {"step": name, "status": status, "detail": detail, "seconds": seconds, "budget_s": BUDGET_S.get(name),
            **extra}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry", action="store_true", help="the host side of every step, on a CPU host")
    parser.add_argument("--steps", nargs="+", choices=list(STEPS), default=list(STEPS))
    args = parser.parse_args(argv)
    run = Run(sys.executable, args.dry)
    steps = ([run_step(run, "dry", step_dry)] if args.dry else []) + [run_step(run, n, STEPS[n]) for n in args.steps]
    payload = gpu_payload.PAYLOAD / "payload.json"
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "dry": args.dry,
              "commit": json.loads(payload.read_text())["commit"] if payload.is_file() else "unknown",
              "python": sys.version.split()[0], "budget_s": sum(BUDGET_S[n] for n in args.steps), "steps": steps}
    folder = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "out" / "gpu_check"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ("gpu_check_dry.json" if args.dry else "gpu_check.json")).write_text(json.dumps(report, indent=1) + "\n")
    failed = [s["step"] for s in steps if s["status"] == "FAIL"]
    print(f"{'FAIL' if failed else 'PASS'}: {len(steps)} steps, {len(failed)} failed {failed or ''}; report in {folder}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
