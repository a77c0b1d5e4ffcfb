"""The C++ runtime's TensorRT side without TensorRT: its build finds TensorRT where NVIDIA puts it and fails at
configure time in one sentence where there is none; its engine choice per segment is the Python runtime's on a
host it is not (an index record, an engine trtexec saved under the planned name, a modified engine, none)."""

import json
import os
import shutil
import subprocess

import pytest

from cpp_harness import BUILD, ROOT
from mmtrt.backends.tensorrt.engines import Target, engine_file, engine_key, select
from mmtrt.bundle.manifest import read_manifest, sha256_file

SOURCE = ROOT / "mmtrt" / "runtime" / "cpp"
SELECT = BUILD / "mmtrt-engine-select"
H200_TRT11 = Target("9.0", "11.4.0.106")
NEEDS = ("MMTRT_WITH_TENSORRT=ON needs TensorRT 11's C++ headers (NvInfer.h) and library (libnvinfer) with the CUDA "
         "toolkit: unpack NVIDIA's TensorRT tarball and pass -DTENSORRT_ROOT=<its folder>, or install the "
         "Debian/Ubuntu packages libnvinfer-dev and libnvinfer-headers-dev (the pip wheels ship no headers).")


def configure(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("TENSORRT_ROOT", "TensorRT_ROOT")}
    deps = (BUILD / "deps").resolve()
    return subprocess.run(["cmake", "-S", str(SOURCE), "-B", str(tmp_path / "build"), "-G", "Ninja",
                           f"-DMMTRT_DEPS={deps}", "-DMMTRT_WITH_TENSORRT=ON", *args],
                          capture_output=True, text=True, timeout=300, env=env)


needs_deps = pytest.mark.skipif(not (BUILD / "deps" / "ort" / "include").is_dir() or not shutil.which("cmake"),
                                reason="the C++ runtime's dependencies are not fetched; run `make cpp`")


@needs_deps
@pytest.mark.skipif(os.path.exists("/usr/include/x86_64-linux-gnu/NvInfer.h"), reason="TensorRT is installed here")
def test_configure_without_tensorrt_says_what_a_host_needs(tmp_path):
    proc = configure(tmp_path)
    assert proc.returncode != 0
    assert NEEDS in " ".join(proc.stderr.split()), proc.stderr


@needs_deps
def test_configure_finds_a_tarball_at_tensorrt_root(tmp_path):
    root = tmp_path / "TensorRT-11.4.0.106"  # the tarball's layout: include/NvInfer.h, lib/libnvinfer.so
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "NvInfer.h").write_text("")
    (root / "lib" / "libnvinfer.so").write_bytes(b"")
    proc = configure(tmp_path, f"-DTENSORRT_ROOT={root}")
    assert NEEDS not in " ".join(proc.stderr.split()), proc.stderr
    cache = (tmp_path / "build" / "CMakeCache.txt").read_text()
    assert f"MMTRT_NVINFER_INCLUDE:PATH={root / 'include'}" in cache
    assert f"MMTRT_NVINFER_LIBRARY:FILEPATH={root / 'lib' / 'libnvinfer.so'}" in cache


def cpp_choices(bundle, target):
    proc = subprocess.run([str(SELECT), str(bundle), target.compute_capability, target.tensorrt],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def python_choices(bundle, target):
    index_path = bundle / "engines" / "index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    out = {}
    for entry in read_manifest(bundle)["tensorrt"]["segments"]:
        path, why = select(bundle, entry, target, index)
        out[entry["id"]] = {"engine": None if path is None else str(path.relative_to(bundle)), "why": why}
    return out


@pytest.mark.skipif(not SELECT.is_file(), reason=f"{SELECT} is not built; run `make cpp`")
def test_engine_choice_is_the_python_runtimes(tiny_bundle, tmp_path):
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    llm, vision = (next(e for e in read_manifest(bundle)["tensorrt"]["segments"] if e["id"] == name)
                   for name in ("llm.0", "vision.0"))
    assert cpp_choices(bundle, H200_TRT11) == python_choices(bundle, H200_TRT11)  # none built
    (bundle / "engines").mkdir()
    (bundle / engine_file(llm, H200_TRT11)).write_bytes(b"an engine trtexec saved under the planned name")
    vision_file = bundle / engine_file(vision, H200_TRT11)
    vision_file.write_bytes(b"an engine build-engines recorded")
    index = {engine_key(vision, H200_TRT11): {"segment": "vision.0", "target": H200_TRT11.tag(),
                                              "file": engine_file(vision, H200_TRT11),
                                              "sha256": sha256_file(vision_file)}}
    (bundle / "engines" / "index.json").write_text(json.dumps(index))
    ours = cpp_choices(bundle, H200_TRT11)
    assert ours == python_choices(bundle, H200_TRT11)
    assert ours["llm.0"]["engine"] == engine_file(llm, H200_TRT11) and "built outside build-engines" in ours["llm.0"]["why"]
    assert ours["vision.0"] == {"engine": engine_file(vision, H200_TRT11), "why": f"engine {engine_file(vision, H200_TRT11)}"}
    vision_file.write_bytes(b"modified")
    other = Target("8.9", "11.4.0.106")
    for target in (H200_TRT11, other):  # a modified engine; another GPU, which lists what was built
        assert cpp_choices(bundle, target) == python_choices(bundle, target)
    assert "built for: sm90-trt11.4.0.106" in cpp_choices(bundle, other)["vision.0"]["why"]
