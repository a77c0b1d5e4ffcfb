"""A segment file reads its component's weights, never a copy: the static KV cache's LLM is placed in its TensorRT
form, cut into a segment file of its own, which reads llm.onnx.data. No tensor's bytes lie twice in the bundle; the
segment, opened from its file by ONNX Runtime, computes what the LLM's GroupQueryAttention form computes; the
runtime decodes the hf bundle's tokens; TensorRT-RTX's builder builds the segment from its file; a second compile
writes the same bytes."""

import hashlib
import json
import shutil
from collections import defaultdict

import numpy as np
import onnx
import pytest

from builders import StaticCacheForm, random_image
from conftest import ROOT
from mmtrt.bundle.manifest import read_manifest
from mmtrt.cli import main
from mmtrt.compiler import compile_recipe
from mmtrt.runtime import load

RECIPE = ROOT / "recipes" / "tiny-llava-static.yaml"


@pytest.fixture(scope="module")
def static(tmp_path_factory):
    return compile_recipe(RECIPE, tmp_path_factory.mktemp("static") / "static.bundle")


def llm_segment(bundle):
    manifest = read_manifest(bundle)
    (segment,) = manifest["placement"]["llm"]["segments"]
    return segment, next(e for e in manifest["tensorrt"]["segments"] if e["id"] == segment["id"])


def external_places(bundle):
    """(dtype, dims, sha256 of the bytes) -> every (data file, offset, length) an ONNX file of the bundle reads such a
    tensor at."""
    places = defaultdict(set)
    for path in sorted(bundle.rglob("*.onnx")):
        for tensor in onnx.load(path, load_external_data=False).graph.initializer:
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            where = {e.key: e.value for e in tensor.external_data}
            offset, length = int(where.get("offset", 0)), int(where["length"])
            data = path.parent / where["location"]
            with open(data, "rb") as f:
                f.seek(offset)
                key = tensor.data_type, tuple(tensor.dims), hashlib.sha256(f.read(length)).digest()
            places[key].add((data.relative_to(bundle).as_posix(), offset, length))
    return places


def test_the_segment_reads_the_llms_data_and_no_bytes_lie_twice(static):
    segment, entry = llm_segment(static)
    assert segment["onnx"] == entry["onnx"] == "llm.0.segment.onnx" and entry["tensorrt_onnx"].endswith(".trt.onnx")
    assert "llm.onnx.data" in segment["files"] and segment["files"] == entry["files"]
    assert not (static / "segments").exists()
    places = external_places(static)
    assert all(len(p) == 1 for p in places.values()), [p for p in places.values() if len(p) > 1][:2]
    # every byte of every data file is some tensor's, read from one place
    data = sum(p.stat().st_size for p in static.rglob("*.data"))
    assert data == sum(length for p in places.values() for _, _, length in p)


def test_the_segment_from_its_file_computes_the_gqa_form(static, rng):
    segment, _ = llm_segment(static)
    manifest = read_manifest(static)
    llm, capacity = manifest["model"]["llm"], manifest["dims"]["capacity"]["max"]
    ours = StaticCacheForm(static / segment["onnx"], llm, capacity)
    theirs = StaticCacheForm(onnx.load(static / "llm.onnx"), llm, capacity)
    hidden = onnx.load(static / "llm.onnx", load_external_data=False).graph.input[0].type.tensor_type.shape.dim[2]
    for step, seq in enumerate([int(rng.integers(2, 40)), 1, 1, 3, 1]):
        embeds = rng.standard_normal((1, seq, hidden.dim_value)).astype(np.float32)
        np.testing.assert_allclose(ours.step(embeds), theirs.step(embeds), rtol=1e-4, atol=1e-5, err_msg=f"step {step}")


def test_the_runtime_decodes_the_hf_bundles_tokens(static, tiny_bundle, rng, tmp_path):
    ours, reference = load(static, threads=1), load(tiny_bundle, threads=1)
    for prompt in ["What is in the picture?", "Describe the colours, then count the objects. " * 3]:
        image = tmp_path / "image.png"
        random_image(rng, int(rng.integers(24, 140)), int(rng.integers(24, 140))).save(image)
        theirs = reference.generate(image, prompt).to_json()["token_ids"]
        assert ours.generate(image, prompt).to_json()["token_ids"] == theirs


def test_rtx_builds_the_segment_from_its_file(static, tmp_path, capsys):
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is installed by `make test` (pyproject extra rtx)")
    bundle = shutil.copytree(static, tmp_path / "b")
    assert main(["build-engines", str(bundle), "--target", "rtx", "--json"]) == 0
    records = {r["segment"]: r for r in json.loads(capsys.readouterr().out)}
    assert records["llm.0"]["status"] == "built" and records["llm.0"]["engine_bytes"] > 100_000


def test_a_second_compile_writes_the_same_bytes(static, tmp_path):
    again = compile_recipe(RECIPE, tmp_path / "again.bundle")
    assert read_manifest(again)["artifacts"] == read_manifest(static)["artifacts"]
    assert llm_segment(again)[1]["sha256"] == llm_segment(static)[1]["sha256"]
