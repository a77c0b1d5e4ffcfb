#!/usr/bin/env bash
# The GPU check. On a CPU host, `scripts/gpu_check.sh prepare` builds what the GPU host needs into ignored folders
# (cubins and PTX in build/kernels, a `kv_layout: static` bundle in out/gpu_check, the wheels the GPU image lacks in
# .whl) and runs every step's host side with --dry-run. On the GPU host, `scripts/gpu_check.sh` (those three folders
# carried beside the working tree; no virtual environment, no nvcc needed: the system python3 with PyTorch, CuPy and
# ONNX Runtime) runs: the plugin kernels through CuPy, the static bundle on ONNX Runtime's CUDA provider against the
# CPU, the kernel check once under compute-sanitizer (memcheck), and, where tensorrt imports, the TensorRT engines
# against ONNX Runtime through Polygraphy. Each step prints PASS, FAIL or SKIP with its reason; the exit code is
# non-zero when a step failed.
#
# Usage:  scripts/gpu_check.sh prepare      (CPU host, in the repository's .venv)
#         scripts/gpu_check.sh              (GPU host; PYTHON=... overrides python3)
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=out/gpu_check
WHEELS="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 onnx-graphsurgeon==0.6.1"

if [ "${1:-}" = prepare ]; then
  set -e
  PY=.venv/bin/python
  "$PY" -m mmtrt.kernels.build
  mkdir -p "$DIR"
  sed 's/^envelope:/  - kv_layout: {layout: static}\nenvelope:/' recipes/tiny-llava.yaml > "$DIR.recipe.yaml"
  "$PY" -m mmtrt.cli compile "$DIR.recipe.yaml" -o "$DIR/static.bundle" --force
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $WHEELS
  set +e
  cubins=$(ls -d build/kernels/cuda-* | tail -1)
  "$PY" scripts/gpu_check.py kernels "$cubins" --dry-run
  "$PY" scripts/gpu_check.py ort-cuda "$DIR/static.bundle" --dry-run
  "$PY" scripts/gpu_check.py engines "$DIR/static.bundle" --dry-run
  exit $?
fi

PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu_check_site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/gpu_check_site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cubins=$(ls -d build/kernels/cuda-* 2>/dev/null | tail -1)
[ -n "$cubins" ] || { echo "FAIL setup: no build/kernels/cuda-* (run scripts/gpu_check.sh prepare and carry build/kernels)"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
status=0
"$PY" scripts/gpu_check.py kernels "$cubins" || status=1
"$PY" scripts/gpu_check.py ort-cuda "$DIR/static.bundle" || status=1
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 3 "$PY" scripts/gpu_kernel_check.py --cubins "$cubins" --quick \
    > "$DIR/sanitizer.log" 2>&1
  case $? in
    0) echo "PASS compute-sanitizer: memcheck found no error in the quick kernel cases" ;;
    3) echo "FAIL compute-sanitizer: memcheck errors, see $DIR/sanitizer.log"; status=1 ;;
    *) echo "SKIP compute-sanitizer: it could not run here: $(grep -m1 -iE 'error|not supported' "$DIR/sanitizer.log")" ;;
  esac
else
  echo "SKIP compute-sanitizer: not installed"
fi
"$PY" scripts/gpu_check.py engines "$DIR/static.bundle" || status=1
exit $status
