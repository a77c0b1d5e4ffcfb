"""A night's measurements: build facts, mmtrt's eval suites, and timings taken in interleaved rounds so that
every recipe sees the same load on a shared host and ratios to the reference recipe stay meaningful."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from mmtrt.bundle.manifest import BUILD_REPORT
from mmtrt.nightly.config import Benchmark
from mmtrt.progress import track


def build_metrics(bundle: Path) -> dict[str, float]:
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    compile_s = json.loads((bundle / BUILD_REPORT).read_text())["compile_seconds"]
    return {"build.bundle_mb": round(size / 2**20, 4), "build.compile_s": compile_s}


def eval_metrics(bundle: Path, suites: dict[str, int | None], threads: int) -> dict[str, float]:
    """`suite.metric` for every suite the entry names, each with its limit."""
    from mmtrt.eval.source import source_model
    from mmtrt.eval.suites import run_suite
    from mmtrt.runtime import load

    pipe = load(bundle, threads=threads)
    found = {}
    for suite, limit in suites.items():
        source = source_model(pipe.manifest) if suite == "parity" else None
        out = run_suite(pipe, suite, limit, source=source)
        found.update({f"{suite}.{k}": v for k, v in out["metrics"].items()})
    return found


def benchmark(bundles: dict[str, Path], config: Benchmark,
              image: Path) -> tuple[dict[str, dict[str, float]], dict[str, Exception]]:
    """Each timing per recipe over `rounds` rounds, reduced by `statistic`, the recipes taking turns within each
    round; a recipe that fails to load or run leaves the rounds with its error."""
    from mmtrt.runtime import load

    pipes, errors = {}, {}
    for name, path in bundles.items():
        try:
            pipes[name] = load(path, threads=config.threads, spin=False)
        except Exception as exc:
            errors[name] = exc
    samples: dict[str, dict[str, list[float]]] = {name: {t: [] for t in config.timings} for name in pipes}
    rounds = config.warmup + config.rounds
    for round_index in track(range(rounds), "nightly: benchmark", total=rounds):
        for name in [n for n in pipes if n not in errors]:
            try:
                timings = pipes[name].generate(image, config.prompt, max_new_tokens=config.max_new_tokens).timings
            except Exception as exc:
                errors[name] = exc
                continue
            if round_index >= config.warmup:
                for t in config.timings:
                    samples[name][t].append(timings[t])
    reduce = min if config.statistic == "min" else statistics.median
    found = {name: {f"bench.{t}": round(reduce(v), 4) for t, v in per.items()}
             for name, per in samples.items() if name not in errors}
    return found, errors


def ratios(timings: dict[str, dict[str, float]], reference: str) -> dict[str, dict[str, float]]:
    """Each timing divided by the reference recipe's, as `bench.<timing>_ratio`."""
    ref = timings.get(reference)
    if not ref:
        return {}
    return {name: {f"{k}_ratio": round(v / ref[k], 4) for k, v in per.items() if ref[k] > 0}
            for name, per in timings.items()}
