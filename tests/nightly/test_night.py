"""The nightly end to end on zoo:tiny-llava: cache hits on an unchanged second night, one changed recipe rebuilt
alone, an injected regression (int4 weights against the fp32 baseline) that fires its rule in all three reports
and exits 1, a failing recipe reported while the others finish."""

import html
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from conftest import ROOT
from mmtrt.cli import main
from mmtrt.nightly import cache as cache_module

LOSSLESS = "[{dead_layer_elimination: {}}, {graph_cleanup: {}}]"
INT4 = ("[{graph_cleanup: {}}, {awq_int4: {method: rtn, group_size: 32, accuracy_level: 0, "
        "calibration: {samples: 1, text_windows: 1}}}]")
SUITES = "{perplexity: 1, parity: 1}"


def config(variant_passes: str, broken: bool, extra: bool = False) -> str:
    text = f"""reference: base
history: history.sqlite
cache: cache
recipes:
  - {{name: base, recipe: {ROOT}/recipes/tiny-llava.yaml, eval: {SUITES}}}
  - {{name: variant, recipe: {ROOT}/recipes/tiny-llava.yaml, override: {{passes: {variant_passes}}}, eval: {SUITES}}}
"""
    if broken:
        text += "  - {name: broken, recipe: broken.yaml}\n"
    if extra:  # a recipe no night has built yet
        text += (f"  - {{name: extra, recipe: {ROOT}/recipes/tiny-llava.yaml, "
                 "override: {passes: [{graph_cleanup: {}}]}}\n")
    return text + f"""benchmark: {{rounds: 2, warmup: 1, image: {ROOT}/examples/sample.png, max_new_tokens: 4}}
rules: {{latency_ratio_increase_pct: null}}
"""


def night(work, name, text, monkeypatch):
    """Run `mmtrt nightly` in this process, counting the compiles; returns exit code, JSON, JUnit, HTML, compiles."""
    compiled = []
    real = cache_module.compile_recipe

    def counting(recipe, out, **kw):
        compiled.append(recipe)
        return real(recipe, out, **kw)

    monkeypatch.setattr(cache_module, "compile_recipe", counting)
    (work / f"{name}.yaml").write_text(text)
    out = work / f"report-{name}"
    code = main(["nightly", str(work / f"{name}.yaml"), "-o", str(out), "--label", name])
    monkeypatch.undo()
    data = json.loads((out / "nightly.json").read_text())
    return code, data, ET.parse(out / "junit.xml").getroot(), (out / "index.html").read_text(), compiled


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    work = tmp_path_factory.mktemp("nightly")
    (work / "broken.yaml").write_text("model: {source: hf, path: no-such-checkpoint}\n")
    mp = pytest.MonkeyPatch()
    runs = {"cold": night(work, "cold", config(LOSSLESS, broken=True), mp),
            "warm": night(work, "warm", config(LOSSLESS, broken=False), mp),
            "int4": night(work, "int4", config(INT4, broken=False), mp)}
    return work, runs


def results(data):
    return {r["recipe"]: r for r in data["results"]}


def test_failing_recipe_is_reported_and_the_others_finish(nights):
    _, runs = nights
    code, data, junit, page, compiled = runs["cold"]
    assert code == 1 and len(compiled) == 2
    by = results(data)
    assert by["broken"]["status"] == "failed" and "\n" not in by["broken"]["error"]
    assert "no-such-checkpoint does not exist" in by["broken"]["error"]
    assert by["base"]["status"] == by["variant"]["status"] == "ok"
    assert by["base"]["changed"] == ["first build"]
    measured = set(by["variant"]["metrics"])
    assert {"perplexity.perplexity", "parity.top1_agreement_pct", "bench.prefill_ms_ratio"} <= measured
    assert by["base"]["metrics"]["bench.prefill_ms_ratio"] == 1.0
    errors = junit.findall(".//testcase[@name='broken']/error")
    assert len(errors) == 1 and "no-such-checkpoint" in errors[0].get("message")
    assert "no-such-checkpoint" in page


def test_unchanged_night_compiles_nothing_and_measures_the_same(nights):
    _, runs = nights
    code, data, _, _, compiled = runs["warm"]
    cold = results(runs["cold"][1])
    assert code == 0 and compiled == [] and data["regressions"] == []
    for name, r in results(data).items():
        assert r["cache"] == "hit" and r["bundle_sha256"] == cold[name]["bundle_sha256"]
        # stated noise: none for the suites and build facts (same bundle, same ONNX Runtime); timings vary
        for metric, value in r["metrics"].items():
            if not metric.startswith("bench."):
                assert value == pytest.approx(cold[name]["metrics"][metric], rel=1e-9), metric
        assert r["baseline"]["night_id"] == runs["cold"][1]["night"]["id"]


def test_changed_recipe_rebuilds_alone_and_its_regression_fires_everywhere(nights):
    _, runs = nights
    code, data, junit, page, compiled = runs["int4"]
    by = results(data)
    assert code == 1 and len(compiled) == 1
    assert by["base"]["cache"] == "hit" and by["variant"]["cache"] == "miss"
    assert by["variant"]["changed"] == ["pass:awq_int4 added", "pass:dead_layer_elimination removed", "recipe"]
    fired = [f for f in by["variant"]["fired"] if f["rule"] == "accuracy_drop_points"]
    assert fired and fired[0]["metric"].startswith("parity.")
    assert by["base"]["fired"] == []
    assert any(r["recipe"] == "variant" and r["rule"] == "accuracy_drop_points" for r in data["regressions"])
    failures = junit.findall(".//testcase[@name='variant']/failure")
    assert any(f.get("type") == "accuracy_drop_points" for f in failures)
    assert not junit.findall(".//testcase[@name='base']/failure")
    assert "REGRESSED" in page and html.escape(fired[0]["message"]) in page


def test_history_holds_every_night_and_the_baseline_skips_regressed_ones(nights):
    work, runs = nights
    with sqlite3.connect(work / "history.sqlite") as db:
        labels = [r[0] for r in db.execute("select label from nights order by id")]
        rows = db.execute("select count(*) from results").fetchone()[0]
    assert labels == ["cold", "warm", "int4"] and rows == 3 + 2 + 2
    assert results(runs["int4"][1])["variant"]["baseline"]["night_id"] == runs["warm"][1]["night"]["id"]


def test_report_has_plots_for_every_metric(nights):
    work, runs = nights
    plots = {p.name for p in (work / "report-int4" / "plots").glob("*.png")}
    assert "current-vs-baseline.png" in plots
    assert {"parity-top1_agreement_pct.png", "perplexity-perplexity.png", "build-bundle_mb.png"} <= plots
    assert all((work / "report-int4" / "plots" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
    assert 'src="plots/current-vs-baseline.png"' in runs["int4"][3]


def snapshot(db_path):
    with sqlite3.connect(db_path) as db:
        return [db.execute(f"select * from {t} order by id").fetchall() for t in ("nights", "results")]


def start_and_wait_for_staging(work, name):
    """Start a night that must compile a new recipe; return the process once its bundle is being staged."""
    (work / f"{name}.yaml").write_text(config(LOSSLESS, broken=False, extra=True))
    proc = subprocess.Popen([sys.executable, "-m", "mmtrt.cli", "nightly", str(work / f"{name}.yaml"), "-o",
                             str(work / f"report-{name}")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "MMTRT_NO_PROGRESS": "1"})
    deadline = time.monotonic() + 240
    while not list((work / "cache" / "extra").glob(".*.tmp-*")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never started staging a bundle"
        time.sleep(0.2)
    time.sleep(1.0)  # inside the compile: the model is being lowered into the staging folder
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_run_leaves_history_and_cache_as_they_were(nights, sig):
    from mmtrt.nightly.cache import BuildCache

    work, _ = nights
    before = snapshot(work / "history.sqlite")
    entries = sorted(p for p in (work / "cache").glob("*/*") if not p.name.startswith("."))
    proc = start_and_wait_for_staging(work, f"killed-{sig.name}")
    proc.send_signal(sig)
    code = proc.wait(timeout=60)
    assert code == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
    assert snapshot(work / "history.sqlite") == before
    assert sorted(p for p in (work / "cache").glob("*/*") if not p.name.startswith(".")) == entries
    stale = list((work / "cache" / "extra").glob(".*.tmp-*"))
    if sig == signal.SIGTERM:
        assert stale == [], "SIGTERM unwinds: the staging folder must be gone"
        assert b"history and the cache are as they were" in proc.stderr.read()
    else:
        assert stale, "SIGKILL gives no chance to clean up: the next run must sweep it"
        with BuildCache(work / "cache").locked() as cache:
            assert not list((work / "cache" / "extra").glob(".*.tmp-*"))
            assert all(cache.lookup(e.parent.name, e.name) for e in entries)


def test_shards_record_nothing_and_merge_into_one_night(nights, capsys):
    work, _ = nights
    before = snapshot(work / "history.sqlite")
    shard_dirs = []
    for i in (1, 2):
        out = work / f"shard-{i}"
        code = main(["nightly", str(work / "int4.yaml"), "--shard", f"{i}/2", "-o", str(out)])
        assert code == (0 if i == 1 else 1)  # the regressed variant is in shard 2
        data = json.loads((out / "nightly.json").read_text())
        assert not data["recorded"] and data["night"]["shard"] == f"{i}/2"
        assert {r["recipe"] for r in data["results"]} == ({"base"} if i == 1 else {"base", "variant"})
        assert all(r["cache"] == "hit" for r in data["results"])
        shard_dirs.append(str(out))
    assert snapshot(work / "history.sqlite") == before
    capsys.readouterr()
    assert main(["nightly", str(work / "int4.yaml"), "--merge", *shard_dirs, "-o", str(work / "merged"), "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)  # --json: the report's data and nothing else on stdout
    assert printed == json.loads((work / "merged" / "nightly.json").read_text()) and printed["night"]["shards"] == 2
    nights_after, results_after = snapshot(work / "history.sqlite")
    assert len(nights_after) == len(before[0]) + 1 and len(results_after) == len(before[1]) + 2
    with sqlite3.connect(work / "history.sqlite") as db:
        shards, = db.execute("select shards from nights order by id desc limit 1").fetchone()
        recipes = sorted(r[0] for r in db.execute(
            "select recipe from results where night_id = (select max(id) from nights)"))
    assert shards == 2 and recipes == ["base", "variant"]
