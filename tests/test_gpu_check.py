"""scripts/gpu_check.sh as far as a CPU host can check it: `prepare` then `run --dry` (the payload within the 64 MiB a
device call carries, every import found on the GPU image's package list or in a carried wheel, every script
parsing, every kernel of kernels.cu in the PTX, the roofline page's cases in the kernel check's order), the steps
that need what the lent machine lacks reporting SKIP rather than FAIL, the driver check of the PTX's ISA, the
roofline judgement of Nsight Compute's CSV, and the engine step's Polygraphy comparison on ONNX Runtime runners
standing where the TensorRT engine goes on a GPU host."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402
import gpu_payload  # noqa: E402
import gpu_roofline  # noqa: E402

spec = importlib.util.spec_from_file_location("gpu_backend_check", ROOT / "scripts" / "gpu_backend_check.py")
gpu_backend_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_backend_check)
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """`prepare`, then `run --dry`: its exit code, printed lines and JSON report."""
    out = tmp_path_factory.mktemp("out")
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out)}
    prepared = subprocess.run([str(SCRIPT), "prepare"], capture_output=True, text=True, env=env, timeout=900)
    if prepared.returncode and "cannot download the wheels" in prepared.stderr:
        pytest.skip(prepared.stderr.strip().splitlines()[-1])  # no package index reachable from here
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    done = subprocess.run([str(SCRIPT), "run", "--dry"], capture_output=True, text=True, env=env, timeout=300)
    report = json.loads((out / "gpu_check_dry.json").read_text())
    return done, report


def test_the_dry_run_passes_and_writes_one_report(dry):
    done, report = dry
    assert done.returncode == 0, done.stdout
    steps = {s["step"]: s for s in report["steps"]}
    assert list(steps) == ["dry", *gpu_check.STEPS] and report["dry"] is True
    assert all(s["status"] in ("PASS", "SKIP") for s in steps.values())
    assert report["budget_s"] <= 8 * 60


def test_the_payload_fits_a_device_call(dry):
    sizes = dry[1]["steps"][0]["sizes"]
    assert sizes["total_bytes"] == sizes["tree_bytes"] + sizes["payload_bytes"] <= 64 * 2**20
    names = set(sizes["payload_files"])
    assert {"kernels/kernels.ptx", "kernels/kernels.sm_90.cubin", "kernels/libmmtrt_kernels_cpu.so"} <= names
    assert any(n.startswith("wheels/pydantic_core-") and "cp312" in n for n in names)
    # no bundle travels: nothing on the lent machine builds engines for one (its steps compile what they need)
    assert {n.split("/")[0] for n in names} == {"kernels", "wheels"}


def test_every_import_is_on_the_image_or_carried(dry):
    imports = dry[1]["steps"][0]["imports"]
    assert imports["missing"] == []
    assert {"cupy", "numpy", "ml_dtypes", "onnx", "pydantic", "onnx_graphsurgeon"} <= set(imports["modules"])
    assert set(imports["guarded"]) <= set(gpu_payload.GUARDED)


def test_a_module_off_the_image_fails_the_import_check(tmp_path):
    listed = tmp_path / "packages.txt"
    lines = (ROOT / "scripts" / "gpu_image_packages.txt").read_text().splitlines()
    listed.write_text("\n".join(line for line in lines if not line.startswith("cupy-")))
    ok, detail, found = gpu_payload.check_imports(listed)
    assert not ok and found["missing"] == ["cupy"] and "cupy" in detail


def test_a_payload_over_the_limit_fails(monkeypatch, dry):
    monkeypatch.setattr(gpu_payload, "LIMIT", dry[1]["steps"][0]["sizes"]["total_bytes"] - 1)
    ok, detail, _ = gpu_payload.check_payload()
    assert not ok and "of 0" not in detail


def test_the_steps_that_need_tensorrt_or_onnxruntime_gpu_skip_without_them(monkeypatch):
    real = importlib.util.find_spec
    absent = ("tensorrt", "tensorrt_rtx", "polygraphy")  # the lent machine's image has none of them
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in absent else real(name, *a))
    status, detail, _ = gpu_check.step_engines(gpu_check.Run(sys.executable, dry=False))
    assert status == "SKIP" and "TensorRT is not installed" in detail
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        status, detail, _ = gpu_check.step_ort_cuda(gpu_check.Run(sys.executable, dry=False))
        assert status == "SKIP" and "onnxruntime-gpu" in detail


def test_the_env_step_reads_the_ptxs_driver_need(dry):
    env = next(s for s in dry[1]["steps"] if s["step"] == "env")
    assert env["status"] == "PASS" and "R580 (CUDA 13.0) or newer" in env["detail"]


NCU = '''==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
'''


def ncu_csv(times: list[tuple[str, float]]) -> str:
    return NCU + "".join(f'"{i}","1","python3","h","{name}(const unsigned short *)","1","7","(256, 1, 1)","(1, 8, 1)",'
                         f'"0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","{ns:,.0f}"\n'
                         for i, (name, ns) in enumerate(times))


def test_the_roofline_judgement_holds_each_case_to_the_pages_bounds(rng):
    rows = gpu_roofline.cases()
    assert [r["plugin"] for r in rows] == gpu_check.roofline_order() and len(rows) == 6
    inside = [(r["kernel"], 1e3 * (r["floor_us"] + r["ceiling_us"]) / 2 * rng.uniform(0.9, 1.1)) for r in rows
              for _ in range(5)]
    ok, _, results = gpu_roofline.judge(rows, gpu_roofline.launches(ncu_csv(inside)), 5)
    assert ok and all(r["ok"] for r in results)
    fast = list(inside)
    fast[25:30] = [(rows[5]["kernel"], 1e3 * rows[5]["floor_us"] / 2)] * 5  # faster than the roofline allows
    ok, _, results = gpu_roofline.judge(rows, gpu_roofline.launches(ncu_csv(fast)), 5)
    assert not ok and [r["ok"] for r in results] == [True] * 5 + [False]
    ok, detail, _ = gpu_roofline.judge(rows, gpu_roofline.launches(ncu_csv(inside[:-1])), 5)
    assert not ok and "29 launches" in detail


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def linear(path, weight):
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)
    return str(path)


def test_the_engine_comparison_passes_equal_outputs_and_fails_different_ones(tmp_path, rng):
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    w = rng.standard_normal((8, 4)).astype(np.float32)
    feeds = [{"x": rng.standard_normal((2, 8)).astype(np.float32)} for _ in range(3)]
    runner = lambda weight, name, file: OnnxrtRunner(SessionFromOnnx(linear(tmp_path / file, weight)), name=name)
    ok, rows, ms = gpu_backend_check.compare([runner(w, "trt", "a.onnx"), runner(w, "ort-cpu", "b.onnx")], feeds, 1e-3)
    assert ok and rows == [("y", 0.0, 0.0, True)] and set(ms) == {"trt", "ort-cpu"}
    ok, rows, _ = gpu_backend_check.compare([runner(w * 1.1, "trt", "c.onnx"), runner(w, "ort-cpu", "d.onnx")], feeds,
                                            1e-3)
    assert not ok and rows[0][0] == "y" and rows[0][1] > 1e-3 and rows[0][3] is False
