"""`mmtrt compare` on the tiny Qwen2-VL and Qwen2.5-VL bundles: every component of a lossless bundle agrees with
transformers (its own vision tower on the drawn grids, its language model on M-RoPE rows), a bundle with one
weight changed in its vision and LLM graphs fails there, a bundle equals itself, and saved vision inputs whose
indices follow no grid are refused in one line."""

import json
import shutil

import numpy as np
import onnx
import pytest

from conftest import QWEN_FAMILIES
from mmtrt.bundle.writer import write_manifest
from mmtrt.cli import main


def run_compare(capsys, *args):
    code = main(["compare", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def compare_torch(capsys, bundle, checkpoint, report, *args):
    code, out, _ = run_compare(capsys, bundle, "--reference", "torch", "--source-model", checkpoint,
                               "--json-out", report, *args)
    return code, out, json.loads(report.read_text())


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_a_lossless_qwen_bundle_matches_transformers(qwen_bundle, qwen_checkpoints, family, tmp_path, capsys):
    code, out, report = compare_torch(capsys, qwen_bundle(family), qwen_checkpoints[family], tmp_path / "r.json")
    assert code == 0 and out.strip().endswith("PASSED"), out
    parts = report["partitions"]
    assert set(parts) == {"vision", "embed", "llm"} and all(p["runners"]["b"] == "pytorch (cpu, fp32)"
                                                            for p in parts.values())
    assert parts["vision"]["iterations"] == 2 and parts["llm"]["iterations"] == 2
    assert 0 < parts["vision"]["outputs"]["image_features"]["max_abs"] < 1e-5


def perturb_first_weight(bundle, component: str) -> str:
    """Add 0.05 to the first element of the first weight kept in the component's data file; its name."""
    model = onnx.load(bundle / f"{component}.onnx", load_external_data=False)
    weight = next(t for t in model.graph.initializer if t.external_data and t.data_type == onnx.TensorProto.FLOAT)
    where = {e.key: e.value for e in weight.external_data}
    data = bundle / where["location"]
    data.chmod(0o644)
    values = np.memmap(data, np.float32, "r+", offset=int(where["offset"]), shape=(1,))
    values[0] += np.float32(0.05)
    values.flush()
    return weight.name


def test_a_changed_weight_fails_against_transformers(qwen_bundle, qwen_checkpoints, tmp_path, capsys):
    family = "qwen2_5_vl"
    copy = shutil.copytree(qwen_bundle(family), tmp_path / "changed.bundle")
    for component in ("vision", "llm"):
        perturb_first_weight(copy, component)
    write_manifest(copy, json.loads((copy / "manifest.json").read_text()))
    code, out, report = compare_torch(capsys, copy, qwen_checkpoints[family], tmp_path / "r.json")
    assert code == 1 and out.strip().endswith("FAILED"), out
    parts = report["partitions"]
    assert not parts["vision"]["passed"] and parts["vision"]["outputs"]["image_features"]["max_abs"] > 1e-3
    assert not parts["llm"]["outputs"]["logits"]["passed"] and parts["embed"]["passed"]


def test_a_qwen_bundle_equals_itself_and_saved_indices_must_follow_a_grid(qwen_bundle, tmp_path, capsys):
    bundle, saved = qwen_bundle("qwen2_vl"), tmp_path / "inputs.npz"
    code, out, _ = run_compare(capsys, bundle, bundle, "--json-out", tmp_path / "r.json", "--save-inputs", saved)
    report = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and all(o["max_abs"] == 0 for p in report["partitions"].values() for o in p["outputs"].values())

    feeds = dict(np.load(saved))
    feeds["vision/0/patch_pos"] = feeds["vision/0/patch_pos"][::-1].copy()
    np.savez(saved, **feeds)
    code, _, err = run_compare(capsys, bundle, bundle, "--inputs", saved)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "vision/0" in err
    assert "are not the indices of one image grid" in err, err


@pytest.mark.parametrize("layout", ["static", "paged, block_tokens: 16"])
def test_a_kv_layout_qwen_llm_matches_transformers_on_mrope_rows(qwen_compile, qwen_checkpoints, layout, tmp_path,
                                                                   capsys):
    """M-RoPE positions do not say where a token sits in the cache: seqlens_k (static) and cache_positions (paged)
    do, and the PyTorch side reads the rows they name."""
    bundle = qwen_compile("qwen2_vl", f"passes:\n  - kv_layout: {{layout: {layout}}}\n",
                          f"qwen2_vl-{layout.split(',')[0]}.bundle")
    code, out, report = compare_torch(capsys, bundle, qwen_checkpoints["qwen2_vl"], tmp_path / "r.json",
                                      "--partition", "llm", "--atol", "1e-4", "--rtol", "1e-3")
    assert code == 0 and out.strip().endswith("PASSED"), out
    assert report["partitions"]["llm"]["iterations"] == 2
