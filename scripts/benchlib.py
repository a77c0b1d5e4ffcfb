"""What the pass benchmarks share: the model lowered once with a recipe's lossless passes, a real bundle per
configuration written by the compiler's own `stage_bundle`, and side-by-side timing (A B A B, medians)."""

from __future__ import annotations

import copy
import pickle
import statistics
import time
from pathlib import Path

import yaml

from mmtrt.compiler import Plan, stage_bundle
from mmtrt.ir.frontend import COMPONENTS, FRONTEND_PROPERTIES, load_source, lower
from mmtrt.ir.graph import ModelIR
from mmtrt.partition.assign import assign_backends
from mmtrt.partition.placement import annotate
from mmtrt.pipeline.runner import plan_passes, run_passes
from mmtrt.recipe import load_recipe


def lossless_ir(path: Path) -> tuple[ModelIR, list[dict]]:
    """The lowered model after the recipe's own (lossless) passes, and their reports."""
    recipe, recipe_dir = load_recipe(path)
    ir = lower(*load_source(recipe.model, recipe_dir))
    annotate(ir, recipe.partition)
    return ir, run_passes(plan_passes(recipe, set(FRONTEND_PROPERTIES), set(COMPONENTS)).passes, ir, [])


def cached_lossless_ir(path: Path, cache: Path | None) -> tuple[ModelIR, list[dict]]:
    """lossless_ir, read from the pickle `cache` when it exists and written to it otherwise (lowering
    zoo:dino-smollm-page takes minutes; a benchmark rerun need not repeat it)."""
    if cache is not None and cache.exists():
        with cache.open("rb") as f:
            return pickle.load(f)
    ir, reports = lossless_ir(path)
    if cache is not None:
        with cache.open("wb") as f:
            pickle.dump((ir, reports), f, protocol=pickle.HIGHEST_PROTOCOL)
    return ir, reports


def plan_for(recipe: Path, folder: Path, entry: dict | None, facts: dict, partition: dict | None = None) -> Plan:
    """The compiler's plan for the recipe plus one pass entry ({name: config}), without rebuilding the model."""
    data = yaml.safe_load(recipe.read_text())
    data["passes"] += [entry] if entry else []
    if partition is not None:
        data["partition"] = partition
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe, recipe_dir = load_recipe(path)
    passes = plan_passes(recipe, set(FRONTEND_PROPERTIES), set(COMPONENTS), facts)
    return Plan(recipe, recipe_dir, facts, passes, assign_backends(recipe.partition, list(COMPONENTS)))


def write_bundle(recipe: Path, base: ModelIR, reports: list[dict], entry: dict | None, folder: Path,
                 changed: tuple[str, ...], partition: dict | None = None) -> tuple[Path, ModelIR, float]:
    """A bundle of `base` with the entry's pass applied, the IR it holds and the pass's seconds; only the
    `changed` components are copied, the rest is shared with `base`."""
    (folder / "bundle").mkdir(parents=True)
    plan = plan_for(recipe, folder, entry, base.config, partition)
    ir = ModelIR({**base.components, **{n: copy.deepcopy(base.components[n]) for n in changed}},
                 copy.deepcopy(base.config), base.assets, set(base.properties))
    start = time.perf_counter()
    reports = reports + run_passes(plan.passes.passes[len(reports):], ir, [])
    seconds = time.perf_counter() - start
    stage_bundle(plan, ir, reports, folder / "bundle")
    return folder / "bundle", ir, seconds


def median_ms(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def side_by_side(base, other, stages: tuple[str, ...], rounds: int, repeats: int = 3
                 ) -> dict[str, tuple[float, float]]:
    """Per stage (a method of both probes), (median ms of base, median ms of other), alternating within every
    round (each round the median of `repeats` calls)."""
    out = {}
    for stage in stages:
        a, b = [], []
        for _ in range(rounds):
            a.append(median_ms(getattr(base, stage), repeats))
            b.append(median_ms(getattr(other, stage), repeats))
        out[stage] = (statistics.median(a), statistics.median(b))
    return out
