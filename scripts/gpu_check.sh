#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py says what each step checks). On a CPU host, in the repository's .venv:
#   scripts/gpu_check.sh prepare      builds .gpu_check/ (the plugins' PTX, cubins and CPU twin; the wheels the GPU
#                                     image lacks), the folder a device call carries beside the working tree
#   scripts/gpu_check.sh run --dry    every step's host side here: payload size, imports, parsing, kernel entries
# On the GPU host (the image's python3; PYTHON overrides), with .gpu_check carried:
#   scripts/gpu_check.sh run          every step, one JSON report under $OUT; exit 1 when a step failed
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  prepare)
    exec "${PYTHON:-.venv/bin/python}" scripts/gpu_payload.py ;;
  run)
    shift
    PY=${PYTHON:-python3}
    if [ "${1:-}" != --dry ] && ls .gpu_check/wheels/*.whl >/dev/null 2>&1; then
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu_check_site .gpu_check/wheels/*.whl || { echo "FAIL setup: the carried wheels did not install"; exit 2; }
      export PYTHONPATH=/tmp/gpu_check_site
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    exec "$PY" scripts/gpu_check.py "$@" ;;
  *)
    echo "usage: scripts/gpu_check.sh prepare | run [--dry] [--steps STEP...]" >&2
    exit 2 ;;
esac
