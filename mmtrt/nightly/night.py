"""One night: build every recipe through the cache, evaluate, benchmark, apply the rules against the last good
night, record the night in one transaction and write the reports. A recipe that fails is reported with its
one-line error; the others go on."""

from __future__ import annotations

import json
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

import mmtrt
from mmtrt.bundle.manifest import bundle_hash
from mmtrt.bundle.staging import raise_if_terminated
from mmtrt.errors import UserError
from mmtrt.nightly import measure, report
from mmtrt.nightly.cache import SCRATCH, BuildCache, compile_into
from mmtrt.nightly.config import NightlyConfig, RecipeEntry, load_config, shard_entries
from mmtrt.nightly.history import History, history_url
from mmtrt.nightly.inputs import build_inputs, cache_key, changed_inputs, effective_recipe, recipe_yaml
from mmtrt.nightly.rules import check
from mmtrt.progress import track

RESULTS = "nightly.json"


def one_line(exc: Exception) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return text if isinstance(exc, UserError) else f"{type(exc).__name__}: {text}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _new_result(name: str) -> dict[str, Any]:
    return {"recipe": name, "status": "ok", "error": None, "stage": None, "cache": None, "cache_key": None,
            "inputs": None, "changed": [], "bundle_sha256": None, "bundle": None, "metrics": {}, "fired": [],
            "nondeterministic": None, "baseline": None}


def _fail(result: dict[str, Any], stage: str, exc: Exception) -> None:
    result.update(status="failed", stage=stage, error=f"{stage}: {one_line(exc)}")


def build(entry: RecipeEntry, base: Path, cache: BuildCache, history: History) -> dict[str, Any]:
    """Reuse the cached bundle when every input is unchanged, else compile and say which input changed."""
    result = _new_result(entry.name)
    try:
        recipe, recipe_dir = effective_recipe(entry, base)
        inputs = build_inputs(recipe, recipe_dir)
        key = cache_key(inputs)
        result.update(inputs=inputs, cache_key=key)
        text = recipe_yaml(recipe, recipe_dir)
        bundle = cache.lookup(entry.name, key)
        result["cache"] = "hit" if bundle else "miss"
        if bundle is None:
            result["changed"] = (changed_inputs(history.last_inputs(entry.name), inputs)
                                 or ["no input changed; the cache had no entry"])
            bundle = cache.build(entry.name, key, text, inputs)
        digest = bundle_hash(bundle)
        result.update(bundle=str(bundle), bundle_sha256=digest, metrics=measure.build_metrics(bundle))
        result["nondeterministic"] = _determinism(entry, result, text, cache, history)
    except Exception as exc:  # one recipe's failure, whatever it is, must not stop the night
        _fail(result, "compile", exc)
    return result


def _determinism(entry, result, text, cache, history) -> str | None:
    """Same inputs, another bundle: against an earlier build in the history, and on request a fresh compile."""
    digest, key = result["bundle_sha256"], result["cache_key"]
    earlier = history.hash_for_key(entry.name, key)
    if earlier and earlier != digest:
        return f"inputs {key[:12]} gave bundle {earlier[:12]} before and {digest[:12]} now"
    if entry.check_determinism and result["cache"] == "hit":
        with tempfile.TemporaryDirectory(prefix=SCRATCH, dir=cache.root) as tmp:
            again = bundle_hash(compile_into(Path(tmp), text))
        if again != digest:
            return f"inputs {key[:12]}: cached bundle {digest[:12]}, recompiled {again[:12]}"
    return None


def evaluate(entries: list[RecipeEntry], results: dict[str, dict], threads: int) -> None:
    todo = [e for e in entries if e.eval and results[e.name]["status"] == "ok"]
    for entry in track(todo, "nightly: eval", total=len(todo)):
        result = results[entry.name]
        try:
            result["metrics"].update(measure.eval_metrics(Path(result["bundle"]), entry.eval, threads))
        except Exception as exc:
            _fail(result, "eval", exc)


def bench(config: NightlyConfig, entries: list[RecipeEntry], results: dict[str, dict], base: Path) -> None:
    todo = {e.name: Path(results[e.name]["bundle"]) for e in entries
            if e.benchmark and results[e.name]["status"] == "ok"}
    if not todo:
        return
    timings, errors = measure.benchmark(todo, config.benchmark, base / config.benchmark.image)
    for name, exc in errors.items():
        _fail(results[name], "benchmark", exc)
    for name, values in timings.items():
        results[name]["metrics"].update(values)
    for name, values in measure.ratios(timings, config.reference).items():
        results[name]["metrics"].update(values)


def apply_rules(config: NightlyConfig, results: list[dict], history: History) -> None:
    by_name = {e.name: e for e in config.recipes}
    for result in results:
        baseline = history.baseline(result["recipe"])
        result["baseline"] = baseline and {"night_id": baseline["night_id"], "metrics": baseline["metrics"]}
        result["fired"] = check(result, baseline, config.rules_for(by_name[result["recipe"]]))


def validate(config: NightlyConfig, entries: list[RecipeEntry], base: Path, out: Path) -> None:
    """Everything the night can check before its work: the report folder, every recipe with its override, the
    benchmark's image. A bad input is exit code 2 with nothing built and no night recorded."""
    if out.exists() and not out.is_dir():
        raise UserError(f"-o {out} is a file; pass a folder for the report")
    for entry in entries:
        effective_recipe(entry, base)
    image = base / config.benchmark.image
    if any(e.benchmark for e in entries) and not image.is_file():
        raise UserError(f"benchmark.image {image} does not exist; pass an image relative to the nightly config")


def run(config_path: Path, out: Path, shard: tuple[int, int] | None = None, history_value: str | None = None,
        label: str | None = None) -> dict[str, Any]:
    """The whole night; returns the report's data (its `exit_code` is 1 when a rule fired)."""
    config, base, config_sha = load_config(config_path)
    entries = shard_entries(config, shard)
    validate(config, entries, base, Path(out))
    history = History(history_url(history_value or config.history, base))
    started, clock = _now(), time.perf_counter()
    with BuildCache(base / config.cache).locked() as cache:
        results = {e.name: build(e, base, cache, history)
                   for e in track(entries, "nightly: build", total=len(entries))}
        evaluate(entries, results, config.benchmark.threads)
        bench(config, entries, results, base)
    night = {"label": label or started[:16], "started_at": started, "finished_at": _now(),
             "host": platform.node(), "mmtrt_version": mmtrt.__version__, "config_sha256": config_sha,
             "shards": 1, "wall_s": round(time.perf_counter() - clock, 2), "shard": shard and f"{shard[0]}/{shard[1]}"}
    return finish(config, history, night, list(results.values()), out, record=shard is None)


def merge(config_path: Path, shard_dirs: list[Path], out: Path, history_value: str | None = None) -> dict[str, Any]:
    """The shards' results as one night in the history: the reference (run by every shard) is kept once."""
    config, base, _ = load_config(config_path)
    if Path(out).exists() and not Path(out).is_dir():
        raise UserError(f"-o {out} is a file; pass a folder for the report")
    shards = [_read_shard(d) for d in shard_dirs]
    history = History(history_url(history_value or config.history, base))
    results: dict[str, dict] = {}
    for shard in shards:
        for result in shard["results"]:
            results.setdefault(result["recipe"], result)
    first = shards[0]["night"]
    night = {**first, "finished_at": max(s["night"]["finished_at"] for s in shards), "shards": len(shards),
             "shard": None, "wall_s": max(s["night"]["wall_s"] for s in shards)}
    return finish(config, history, night, list(results.values()), out, record=True)


def _read_shard(folder: Path) -> dict[str, Any]:
    path = Path(folder) / RESULTS
    if not path.is_file():
        raise UserError(f"{folder} has no {RESULTS}; pass the -o folders of `mmtrt nightly --shard I/N` runs")
    try:
        data = json.loads(path.read_bytes())
    except ValueError as exc:
        raise UserError(f"{path} is not JSON ({exc}); pass the -o folder of a finished shard") from None
    night = data.get("night") if isinstance(data, dict) else None
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(night, dict) or not isinstance(results, list) or not all(
            isinstance(r, dict) and isinstance(r.get("recipe"), str) for r in results) or \
            not all(k in night for k in ("finished_at", "wall_s")):
        raise UserError(f"{path} lacks a shard's `night` and `results`; pass the -o folder of a finished "
                        "`mmtrt nightly --shard I/N` run")
    return data


def finish(config, history: History, night: dict, results: list[dict], out: Path, record: bool) -> dict[str, Any]:
    apply_rules(config, results, history)
    fired = [{"recipe": r["recipe"], **f} for r in results for f in r["fired"]]
    night["regressions"] = len(fired)
    row = {k: v for k, v in night.items() if k not in ("wall_s", "shard")}
    raise_if_terminated()
    night["id"] = history.record(row, results) if record else None
    data = {"night": night, "recorded": record, "history": make_url(history.url).render_as_string(hide_password=True),
            "results": results, "regressions": fired, "exit_code": 1 if fired else 0}
    report.write(Path(out), data, history.series())
    return data
