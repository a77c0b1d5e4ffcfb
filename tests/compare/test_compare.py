"""`mmtrt compare`: equal bundles pass, an fp16 bundle fails tight tolerances (exit 1) and passes loose ones, a
bundle matches its PyTorch source (its LLM on any KV layout), saved inputs reproduce a comparison, and bundle
differences are listed
(the Qwen2-VL families: test_compare_qwen2_vl.py)."""

import json
import shutil

import numpy as np
import pytest

from conftest import ROOT
from mmtrt.bundle.writer import write_manifest
from mmtrt.cli import main
from mmtrt.compiler import compile_recipe


@pytest.fixture(scope="module")
def fp16_bundle(tmp_path_factory):
    return compile_recipe(ROOT / "recipes" / "tiny-llava-fp16.yaml", tmp_path_factory.mktemp("fp16") / "fp16.bundle")


def run_compare(capsys, *args):
    code = main(["compare", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_bundle_equals_itself(tiny_bundle, tmp_path, capsys):
    report_path = tmp_path / "report.json"
    code, out, _ = run_compare(capsys, tiny_bundle, tiny_bundle, "--json-out", report_path)
    assert code == 0 and out.strip().endswith("PASSED")
    report = json.loads(report_path.read_text())
    assert set(report["partitions"]) == {"vision", "embed", "llm"} and report["differences"] == []
    outputs = [o for p in report["partitions"].values() for o in p["outputs"].values()]
    assert len(outputs) == 1 + 1 + 9 and all(o["max_abs"] == 0 and o["passed"] for o in outputs)
    assert report["partitions"]["llm"]["iterations"] == 2 and report["inputs"]["seed"] >= 0


def test_fp16_fails_tight_tolerances_and_passes_loose_ones(fp16_bundle, tiny_bundle, tmp_path, capsys):
    report_path = tmp_path / "report.json"
    code, out, _ = run_compare(capsys, fp16_bundle, tiny_bundle, "--json-out", report_path, "--save-inputs",
                               tmp_path / "inputs.npz")
    assert code == 1 and "FAIL" in out and out.strip().endswith("FAILED")
    report = json.loads(report_path.read_text())
    assert not report["partitions"]["vision"]["outputs"]["image_features"]["passed"]
    assert report["partitions"]["embed"]["passed"]
    diffs = {(d["what"], d["where"]): d for d in report["differences"]}
    assert diffs[("precision", "vision.0")]["a"] == "fp16" and diffs[("precision", "vision.0")]["b"] == "fp32"
    assert ("passes", "recipe") in diffs and ("segments", "llm") in diffs
    logits_error = report["partitions"]["llm"]["outputs"]["logits"]["max_abs"]
    assert 0 < logits_error < 0.05

    again = tmp_path / "again.json"
    code, _, _ = run_compare(capsys, fp16_bundle, tiny_bundle, "--inputs", tmp_path / "inputs.npz",
                             "--atol", "0.05", "--rtol", "0.05", "--json-out", again)
    assert code == 0
    assert json.loads(again.read_text())["partitions"]["llm"]["outputs"]["logits"]["max_abs"] == logits_error


def test_a_bundle_matches_its_pytorch_source(tiny_bundle, capsys):
    code, out, _ = run_compare(capsys, tiny_bundle, "--reference", "torch", "--atol", "1e-4", "--rtol", "1e-3",
                               "--partition", "vision", "--partition", "llm")
    assert code == 0 and "pytorch (cpu, fp32)" in out and "embed" not in out


def test_different_models_are_not_compared(tiny_bundle, siglip_bundle, capsys):
    code, out, _ = run_compare(capsys, tiny_bundle, siglip_bundle, "--partition", "vision")
    assert code == 1 and "vision: NOT COMPARED, the vision contracts differ" in out


@pytest.mark.parametrize("args, words", [
    (["--reference", "torch"], ["second bundle or --reference torch"]),
    ([], ["second bundle or --reference torch"]),
])
def test_bad_usage_is_one_line(tiny_bundle, capsys, args, words):
    extra = [tiny_bundle] if args else []
    code, _, err = run_compare(capsys, tiny_bundle, *extra, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and all(w in err for w in words)


def test_an_architecture_without_a_torch_reference_is_one_line(tiny_bundle, tmp_path, capsys):
    """A bundle of an architecture this mmtrt has no PyTorch partitions for (one a later version lowers)."""
    copy = shutil.copytree(tiny_bundle, tmp_path / "other.bundle")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["model"]["architecture"] = "gemma3"
    write_manifest(copy, manifest)
    code, _, err = run_compare(capsys, copy, "--reference", "torch")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in ["--reference torch runs the components of", "qwen2_5_vl", "not gemma3",
                                  "--suite parity"]), err


@pytest.fixture(scope="module")
def static_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("static")
    return compile_recipe(ROOT / "recipes" / "tiny-llava-static.yaml", folder / "static.bundle")


@pytest.mark.parametrize("layout", ["static", "paged"])
def test_a_kv_layout_bundles_llm_matches_its_pytorch_source(layout, static_bundle, tiny_paged_bundle, tmp_path, capsys):
    """The cache buffers hold random rows beyond the sequence's own (a paged pool: in blocks of a shuffled table),
    so reading or writing outside them fails; saved inputs reproduce the comparison."""
    bundle = {"static": static_bundle, "paged": tiny_paged_bundle}[layout]
    saved, report_path = tmp_path / "inputs.npz", tmp_path / "report.json"
    code, out, _ = run_compare(capsys, bundle, "--reference", "torch", "--atol", "1e-4", "--rtol", "1e-3",
                               "--partition", "llm", "--save-inputs", saved, "--json-out", report_path)
    assert code == 0 and "present.* (8)" in out, out
    first = json.loads(report_path.read_text())["partitions"]["llm"]["outputs"]
    assert run_compare(capsys, bundle, "--reference", "torch", "--atol", "1e-4", "--rtol", "1e-3", "--partition",
                       "llm", "--inputs", saved, "--json-out", report_path)[0] == 0
    again = json.loads(report_path.read_text())["partitions"]["llm"]["outputs"]
    assert {k: v["max_abs"] for k, v in again.items()} == {k: v["max_abs"] for k, v in first.items()}
    feeds = dict(np.load(saved))
    table = feeds.get("llm/1/block_table", np.arange(1))
    assert layout == "static" or sorted(table.ravel()) != list(range(table.size))


def test_sequences_of_different_lengths_in_one_call_are_refused_in_one_line(static_bundle, tmp_path, capsys):
    saved = tmp_path / "inputs.npz"
    run_compare(capsys, static_bundle, static_bundle, "--partition", "llm", "--save-inputs", saved)
    feeds = {k: v for k, v in np.load(saved).items() if k.startswith("llm/1/")}
    feeds = {k: np.concatenate([v, v]) if v.ndim and k != "llm/1/logits_from" else v for k, v in feeds.items()}
    feeds["llm/1/seqlens_k"][1] -= 1
    np.savez(saved, **feeds)
    code, _, err = run_compare(capsys, static_bundle, "--reference", "torch", "--partition", "llm", "--inputs", saved)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "one length per call" in err and "equal lengths" in err, err


def test_the_torch_side_is_float32_only_while_its_runner_is_active():
    """The source model stays in its checkpoint's dtype; a partition's runner widens its modules exactly and
    hands their own tensors back."""
    import torch

    from mmtrt.compare.runners import TorchRunner

    layer = torch.nn.Linear(8, 4).to(torch.bfloat16)
    own = {name: (t.data_ptr(), t.detach().clone()) for name, t in layer.named_parameters()}
    runner = TorchRunner(lambda: layer, [layer], [], "torch:layer")
    runner.activate()
    assert all(t.dtype == torch.float32 and torch.equal(t, own[name][1].float())
               for name, t in layer.named_parameters())
    runner.deactivate()
    assert all(t.dtype == torch.bfloat16 and t.data_ptr() == own[name][0] for name, t in layer.named_parameters())
