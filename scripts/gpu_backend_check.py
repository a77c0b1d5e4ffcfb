"""The GPU check's backend steps, run only where their backend is installed (gpu_check.py's guards report SKIP
otherwise, before anything here imports): `ort-cuda BUNDLE`, a `kv_layout: static` bundle on ONNX Runtime's CUDA
provider, its KV cache in GPU memory, tokens against the CPU; `engines BUNDLE...`, every TensorRT engine against
ONNX Runtime through Polygraphy. Each ends in one line `PASS|FAIL|SKIP step: detail`; exit 1 when one failed.

Usage: python scripts/gpu_backend_check.py {ort-cuda,engines} BUNDLE... [--dry-run]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
WORDS = ["red", "cat", "under", "the", "blue", "table"]
TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 5e-2}


def report(ok: bool | None, step: str, detail: str) -> bool:
    print(f"{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'} {step}: {detail}", flush=True)
    return ok is not False


def ort_cuda(bundle: Path, dry_run: bool) -> bool:
    import numpy as np

    import mmtrt.backends.onnxruntime_backend as ort_backend
    from PIL import Image

    from mmtrt.runtime import load
    from mmtrt.runtime.batch import Request, StaticStepper
    from mmtrt.runtime.kv import StaticCache

    gpu = load(bundle)
    if dry_run:  # the GPU's code path on the CPU: buffers ONNX Runtime owns, rows copied by its sessions
        host = gpu.stepper.cache
        gpu.stepper = StaticStepper(gpu.stepper.session, StaticCache(
            gpu.kv, gpu.model["llm"], host.rows, host.capacity, "cpu", ["CPUExecutionProvider"]))
    elif gpu.stepper.cache.device != "cuda":
        return report(False, "ort-cuda", f"the LLM session got {gpu.runners['llm'].providers}: ONNX Runtime's CUDA "
                      "provider did not load (an onnxruntime without CUDA, or no GPU)")
    has_gpu = ort_backend._has_cuda_gpu
    ort_backend._has_cuda_gpu = lambda: False
    try:
        cpu = load(bundle)
    finally:
        ort_backend._has_cuda_gpu = has_gpu
    rng = np.random.default_rng(0)
    random_image = lambda h, w: Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    image = random_image(70, 90)
    requests = [Request(random_image(40, 60), " ".join(rng.choice(WORDS, int(rng.integers(1, 12)))),
                        int(rng.integers(2, 20))) for _ in range(6)]
    requests += [Request(image, q, 8) for q in ("What is it?", "What color is it?", "Where is it?")]
    ours, reference = gpu.generate_batch(requests), cpu.generate_batch(requests)
    ours.append(gpu.generate(image, "Is it round?", 8))  # the image's prefix, saved above, loaded into a row
    reference.append(cpu.generate(image, "Is it round?", 8))
    same = sum(a.token_ids == b.token_ids for a, b in zip(ours, reference))
    firsts = all(a.token_ids[:1] == b.token_ids[:1] for a, b in zip(ours, reference))
    return report(firsts and same >= len(ours) - 1 and gpu.prefixes.hits > 0, "ort-cuda",
                  f"{gpu.stepper.cache.device} cache of {gpu.stepper.cache.nbytes} B, LLM on {gpu.runners['llm'].providers[0]}; "
                  f"{same}/{len(ours)} requests give the CPU's tokens, {gpu.prefixes.hits} prefix hits")


def accuracy_of(accuracy, pair: tuple[str, str]) -> list:
    """The per-iteration results of one runner pair: Polygraphy's compare_accuracy returns an AccuracyResult keyed by
    runner-name pairs (and, in 0.53, a list of them, one per comparison function)."""
    result = accuracy if isinstance(accuracy, dict) else accuracy[0]
    return result[pair]


def compare(runners: list, feeds: list[dict], tol: float) -> tuple[bool, list[tuple], dict[str, float]]:
    """Runners[0] against runners[1] on `feeds`: per output (name, max abs, max rel, ok), and each runner's median ms.
    Polygraphy's simple comparison is `SimpleCompareFunc` from 0.53 on and `CompareFunc.simple` before."""
    from polygraphy import comparator

    simple = getattr(comparator, "SimpleCompareFunc", None) or comparator.CompareFunc.simple
    results = comparator.Comparator.run(runners, data_loader=feeds, warm_up=2)
    accuracy = comparator.Comparator.compare_accuracy(results, comparisons=[(0, 1)],
                                                      compare_func=simple(atol=tol, rtol=tol))
    iterations = accuracy_of(accuracy, (runners[0].name, runners[1].name))
    rows = [(name, max(it[name].max_absdiff for it in iterations), max(it[name].max_reldiff for it in iterations),
             all(bool(it[name]) for it in iterations)) for name in iterations[0]]
    ms = {name: statistics.median(r.runtime for r in its) * 1e3 for name, its in results}
    return all(ok for *_, ok in rows), rows, ms


def engines(bundles: list[Path], dry_run: bool) -> bool:
    """Guarded by gpu_check.py's engines step (tensorrt and Polygraphy import) before it runs this."""
    import numpy as np
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from mmtrt.bundle.manifest import read_manifest
    from mmtrt.compare.inputs import generate

    ok = True
    for bundle in bundles:
        manifest = read_manifest(bundle)
        for entry in manifest["tensorrt"]["segments"]:
            rng = np.random.default_rng(0)
            try:
                feeds = [f for _ in range(10) for f in generate(manifest, entry["component"], rng)][:20]
            except KeyError as exc:  # mmtrt.compare generates a component's inputs, not every segment form's
                report(None, f"engines {bundle.name} {entry['id']}", f"no generated inputs for dimension {exc}")
                continue
            reference = OnnxrtRunner(SessionFromOnnx(str(bundle / entry["onnx"]), providers=["cpu"]), name="ort-cpu")
            if dry_run:  # Polygraphy's calls on two ONNX Runtime runners
                first = OnnxrtRunner(SessionFromOnnx(str(bundle / entry["onnx"]), providers=["cpu"]), name="trt")
            else:
                from mmtrt.backends.tensorrt.engines import probe_target, read_index, select
                from mmtrt.backends.tensorrt.runner import trt_runner

                engine, why = select(bundle, entry, probe_target(), read_index(bundle))
                if engine is None:
                    ok &= report(False, f"engines {bundle.name} {entry['id']}", why)
                    continue
                first = trt_runner(engine, entry["profiles"], "trt")
            passed, rows, ms = compare([first, reference], feeds, TOLERANCE[entry["precision"]["dtype"]])
            worst = max(rows, key=lambda r: r[2])
            ok &= report(passed, f"engines {bundle.name} {entry['id']}",
                         f"{len(rows)} outputs, worst {worst[0]} abs {worst[1]:.2e} rel {worst[2]:.2e}; "
                         f"trt {ms['trt']:.3f} ms, ort-cpu {ms['ort-cpu']:.3f} ms")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["ort-cuda", "engines"])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="the same code paths on ONNX Runtime's CPU provider")
    args = parser.parse_args(argv)
    ok = ort_cuda(args.paths[0], args.dry_run) if args.step == "ort-cuda" else engines(args.paths, args.dry_run)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
