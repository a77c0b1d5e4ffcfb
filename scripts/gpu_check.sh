#!/usr/bin/env bash
# The GPU check, for a host with an NVIDIA GPU and TensorRT 11: check the plugin kernels with CuPy, compile the demo bundles (fp32 and fp16), build
# their engines (twice: the second build must find them up to date), compare every engine with ONNX Runtime
# through Polygraphy, time both, print a table, then run the bundle end to end, the LLM through TensorRT-LLM where it
# imports (the digits prompt against ONNX Runtime: tokens and time), and the tests that need TensorRT / TensorRT-LLM.
# NOT RUN YET: no machine of ours has TensorRT. Exits non-zero on the first failure.
#
# Set-up on that host:  python3 -m venv .venv && .venv/bin/pip install -e '.[tensorrt,test]'
# Usage:                scripts/gpu_check.sh            (PYTHON=... and OUT=... override the defaults)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-out/gpu_check}
mkdir -p "$OUT"

# The plugin kernels first: they need CuPy and a GPU, not TensorRT (KERNELS_ONLY=1 stops after them; CUBINS=DIR
# takes prebuilt cubins, e.g. a bundle's plugins/ folder, on a host without nvcc).
"$PY" scripts/gpu_kernel_check.py ${CUBINS:+--cubins "$CUBINS"}
if [ "${KERNELS_ONLY:-0}" = 1 ]; then exit 0; fi

"$PY" - <<'EOF'
import tensorrt, torch
assert torch.cuda.is_available(), "no CUDA GPU is visible"
major, minor = torch.cuda.get_device_capability()
print(f"TensorRT {tensorrt.__version__} on {torch.cuda.get_device_name()} (sm_{major}{minor})")
EOF

for recipe in tiny-llava tiny-llava-fp16; do
  "$PY" -m mmtrt.cli compile "recipes/$recipe.yaml" -o "$OUT/$recipe.bundle" --force
  "$PY" -m mmtrt.cli inspect "$OUT/$recipe.bundle" --placement
  "$PY" -m mmtrt.cli build-engines "$OUT/$recipe.bundle" --json > "$OUT/$recipe.build.json"
  "$PY" -m mmtrt.cli build-engines "$OUT/$recipe.bundle" --json > "$OUT/$recipe.rebuild.json"
  "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); assert all(x["status"] == "up to date" or (
    x["segment"] == "llm (tensorrt-llm)" and x["status"] == "skipped") for x in r), r' "$OUT/$recipe.rebuild.json"
done

# Every engine against ONNX Runtime (CPU, the reference; CUDA timed too where its provider loads), 20 iterations
# after 2 warm-up runs, on inputs generated within each bundle's envelope.
"$PY" - "$OUT"/tiny-llava.bundle "$OUT"/tiny-llava-fp16.bundle <<'EOF'
import statistics, sys
from pathlib import Path

import numpy as np
from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
from polygraphy.comparator import Comparator, SimpleCompareFunc
from polygraphy.logger import G_LOGGER

from mmtrt.backends.tensorrt.engines import probe_target, read_index, select
from mmtrt.backends.tensorrt.runner import trt_runner
from mmtrt.bundle.manifest import read_manifest
from mmtrt.compare.inputs import generate

TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 5e-2}
rows, failed = [], False
for bundle in map(Path, sys.argv[1:]):
    manifest, target, index = read_manifest(bundle), probe_target(), read_index(bundle)
    for entry in manifest["tensorrt"]["segments"]:
        engine, why = select(bundle, entry, target, index)
        assert engine is not None, why
        rng = np.random.default_rng(0)
        feeds = [f for _ in range(10) for f in generate(manifest, entry["component"], rng)][:20]
        runners = [trt_runner(engine, entry["profiles"], "trt"),
                   OnnxrtRunner(SessionFromOnnx(str(bundle / entry["onnx"]), providers=["cpu"]), name="ort-cpu")]
        # ONNX Runtime falls back to the CPU when its CUDA provider cannot load: check what the session got.
        cuda = SessionFromOnnx(str(bundle / entry["onnx"]), providers=["cuda"])()
        if cuda.get_providers()[0] == "CUDAExecutionProvider":
            runners.append(OnnxrtRunner(cuda, name="ort-cuda"))
        else:
            print(f"{entry['id']}: ONNX Runtime's CUDA provider did not load; not timed")
        tol = TOLERANCE[entry["precision"]["dtype"]]
        with G_LOGGER.verbosity():
            results = Comparator.run(runners, data_loader=feeds, warm_up=2)
            accuracy = Comparator.compare_accuracy(results, comparisons=[(0, 1)],
                                                   compare_func=SimpleCompareFunc(atol=tol, rtol=tol))
        ms = {name: statistics.median(r.runtime for r in its) * 1e3 for name, its in results}
        iterations = accuracy[0][("trt", "ort-cpu")]
        for output in iterations[0]:
            stats = [it[output] for it in iterations]
            ok = all(bool(s) for s in stats)
            failed |= not ok
            rows.append((bundle.name, entry["id"], entry["precision"]["dtype"], output,
                         max(s.max_absdiff for s in stats), max(s.max_reldiff for s in stats), ok,
                         ms["trt"], ms["ort-cpu"], ms.get("ort-cuda")))

print(f"\n{'bundle':<24} {'segment':<9} {'prec':<5} {'output':<16} {'max abs':>9} {'max rel':>9} {'ok':>4} "
      f"{'trt ms':>8} {'ort-cpu ms':>10} {'ort-cuda ms':>11}")
for b, seg, prec, out, mabs, mrel, ok, trt, cpu, cuda in rows:
    cuda = f"{cuda:>11.3f}" if cuda is not None else f"{'-':>11}"
    print(f"{b:<24} {seg:<9} {prec:<5} {out:<16} {mabs:>9.2e} {mrel:>9.2e} {'yes' if ok else 'NO':>4} "
          f"{trt:>8.3f} {cpu:>10.3f} {cuda}")
sys.exit(1 if failed else 0)
EOF

# End to end: the runtime must choose every engine (no fallbacks; the TensorRT-LLM one only where tensorrt_llm is
# absent) and generate.
"$PY" -m mmtrt.cli run "$OUT/tiny-llava-fp16.bundle" --image examples/sample.png --prompt "What is in the picture?" \
  --max-new-tokens 8 --json > "$OUT/run.json"
"$PY" - "$OUT/run.json" <<'EOF'
import importlib.util, json, sys
r = json.load(open(sys.argv[1]))
allowed = set() if importlib.util.find_spec("tensorrt_llm") else {"llm (tensorrt-llm)"}
assert set(r["fallbacks"]) <= allowed, r["fallbacks"]
print(r)
EOF

# TensorRT-LLM, where it imports: the engines above include the LLM's (build-engines ran the planned trtllm-build);
# run the digits prompt through it and through ONNX Runtime (the same bundle without its engines), compare the
# tokens and the time (A B A B, medians after a warm-up round).
if "$PY" -c 'import tensorrt_llm' 2>/dev/null; then
  "$PY" - "$OUT/tiny-llava-fp16.bundle" <<'EOF'
import shutil, statistics, sys, tempfile, time
from pathlib import Path

from mmtrt.eval.digits import PROMPT, samples
from mmtrt.runtime import load

bundle = Path(sys.argv[1])
onnx_only = Path(tempfile.mkdtemp()) / "onnx.bundle"
shutil.copytree(bundle, onnx_only, ignore=shutil.ignore_patterns("engines"))
trtllm, ort = load(bundle), load(onnx_only)
assert trtllm.backends["llm"].startswith("tensorrt-llm"), trtllm.fallbacks
image = samples("test", 1)[0][0]
times, tokens = {"tensorrt-llm": [], "onnxruntime": []}, {}
for _ in range(6):
    for name, pipe in (("tensorrt-llm", trtllm), ("onnxruntime", ort)):
        t0 = time.perf_counter()
        tokens[name] = pipe.generate(image, PROMPT, max_new_tokens=16).token_ids
        times[name].append(time.perf_counter() - t0)
ms = {name: 1e3 * statistics.median(t[1:]) for name, t in times.items()}
same = sum(a == b for a, b in zip(tokens["tensorrt-llm"], tokens["onnxruntime"]))
print(f"digits prompt: tensorrt-llm {ms['tensorrt-llm']:.1f} ms, onnxruntime {ms['onnxruntime']:.1f} ms, "
      f"ratio {ms['onnxruntime'] / ms['tensorrt-llm']:.2f}x; tokens equal {same}/{len(tokens['onnxruntime'])}")
print("tensorrt-llm:", tokens["tensorrt-llm"], "\nonnxruntime: ", tokens["onnxruntime"])
assert tokens["tensorrt-llm"][:2] == tokens["onnxruntime"][:2], "the first tokens differ"
EOF
else
  echo "TensorRT-LLM check skipped: tensorrt_llm is not importable on this host"
fi
"$PY" -m mmtrt.cli compare "$OUT/tiny-llava-fp16.bundle" "$OUT/tiny-llava.bundle" --atol 0.05 --rtol 0.05 \
  --json-out "$OUT/compare.json"
"$PY" -m pytest -q -p no:logging tests/backends/test_tensorrt_engines.py tests/backends/test_trtllm_engines.py
