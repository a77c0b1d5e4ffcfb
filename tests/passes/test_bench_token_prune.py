"""scripts/bench_token_prune.py: its in-process digits suite scores as `mmtrt eval` does, an answer is reused only
when the LLM would be fed bit-identical image tokens, and a rerun resumes from the rows already logged."""

import importlib.util
import json
import sys

import pytest

from conftest import ROOT
from mmtrt.eval import digits
from mmtrt.eval.suites import run_suite
from mmtrt.runtime import load

LIMIT = 6


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("bench_token_prune", ROOT / "scripts" / "bench_token_prune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def work(bench, tmp_path_factory):
    """tiny-llava (64 image tokens): fixed keep 0.5 and dynamic rows with max 32, one at a mass every image
    reaches only at 32 tokens or more (so it keeps what keep 0.5 keeps) and one at a mass that keeps fewer."""
    work = tmp_path_factory.mktemp("bench")
    bench.main(["accuracy", "--recipe", str(ROOT / "recipes" / "tiny-llava.yaml"), "--work", str(work), "--limit",
                str(LIMIT), "--methods", "random", "--keeps", "0.5", "--masses", "0.99", "0.3", "--min", "2",
                "--max", "32"])
    return work


def rows(work):
    return {(r["config"], r["keep"]): r for r in map(json.loads, (work / "accuracy.jsonl").read_text().splitlines())}


def test_scores_as_the_digits_suite_does(work):
    for record in rows(work).values():
        metrics = run_suite(load(record["bundle"]), "digits", LIMIT)["metrics"]
        assert set(metrics) == {"accuracy_pct"} | ({"kept_tokens_mean", "kept_tokens_min", "kept_tokens_max"}
                                                   if "mass" in record["keep"] else set())
        assert metrics == {k: record[k] for k in metrics}


def answers(bundle):
    pipe = load(bundle)
    return [pipe.generate(image, digits.PROMPT, max_new_tokens=4).text
            for image, _ in digits.samples("heldout", LIMIT, page=pipe.image_side)]


def test_answers_are_reused_only_for_identical_image_tokens(work):
    logged = rows(work)
    assert answers(logged["random", "mass 0.99"]["bundle"]) == answers(logged["random", "0.5"]["bundle"])
    assert logged["random", "mass 0.99"]["kept_tokens_min"] == 32
    assert logged["random", "mass 0.99"]["answers_reused"] == LIMIT
    assert logged["random", "mass 0.3"]["kept_tokens_max"] < 32
    assert logged["random", "mass 0.3"]["answers_reused"] == 0
    assert logged["random", "0.5"]["answers_reused"] == logged["unpruned", "1.0"]["answers_reused"] == 0


def test_a_rerun_skips_the_logged_rows(bench, work):
    before = (work / "accuracy.jsonl").read_text()
    bench.main(["accuracy", "--recipe", str(ROOT / "recipes" / "tiny-llava.yaml"), "--work", str(work), "--limit",
                str(LIMIT), "--methods", "random", "--keeps", "0.5", "--masses", "0.99", "0.3", "--min", "2",
                "--max", "32"])
    assert (work / "accuracy.jsonl").read_text() == before


def test_unchanged_files_are_links_to_the_unpruned_bundle(work):
    base = work / "unpruned-1.0" / "bundle"
    pruned = work / "random-0.5" / "bundle"
    assert (pruned / "llm.onnx.data").stat().st_ino == (base / "llm.onnx.data").stat().st_ino
    assert (pruned / "vision.onnx").stat().st_ino != (base / "vision.onnx").stat().st_ino
