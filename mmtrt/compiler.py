"""`mmtrt compile`: recipe -> plan -> IR -> passes -> partitions and profiles -> bundle."""

from __future__ import annotations

import gc
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmtrt import __version__
from mmtrt.backends.tensorrt.shipped import check_engine_targets, ship_engines
from mmtrt.bundle import writer
from mmtrt.bundle.manifest import SCHEMA_VERSION, toolchain_versions
from mmtrt.bundle.stored import StoredTensors
from mmtrt.eval.budget import Evaluate, check_budgets
from mmtrt.eval.options import load_suite_data, suite_options
from mmtrt.eval.userdata import Sample
from mmtrt.pipeline.source import source_model
from mmtrt.ir import export, source_weights, spill
from mmtrt.ir.frontend import COMPONENTS, FRONTEND_PROPERTIES, describe_source, fit_envelope, load_source, lower
from mmtrt.ir.graph import ModelIR
from mmtrt.partition.assign import assign_backends
from mmtrt.partition.engine_plan import engine_sections
from mmtrt.partition.placement import annotate
from mmtrt.partition.shapes import plan_dims, plan_profiles
from mmtrt.pipeline.instruments import Dump, Timer, Verify, verify_ir
from mmtrt.pipeline.pass_base import TIMES
from mmtrt.pipeline.runner import PassPlan, plan_passes, run_passes
from mmtrt.progress import facts_digest, quiet_libraries, stage
from mmtrt.quant.calibration import RecipeData, check_recipe_data, load_recipe_data, recipe_data
from mmtrt.recipe import Recipe, load_recipe


@dataclass
class Plan:
    recipe: Recipe
    recipe_dir: Path
    facts: dict[str, Any]
    passes: PassPlan
    partitions: dict[str, dict]
    calibration: RecipeData | None = None
    suite_data: dict[str, list[Sample]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.recipe.model.model_dump(exclude_none=True),
            "components": list(COMPONENTS),
            "image_tokens_before_passes": self.facts["vision"]["image_tokens"],
            "passes": [{"pass": p.name, "config": p.config.model_dump(), "components": list(p.components),
                        "lossy": p.lossy} for p in self.passes.passes],
            "partitions": self.partitions,
            "envelope": self.recipe.envelope.model_dump(),
            "dims_before_passes": plan_dims(self.facts, self.recipe.envelope),
            "image_tokens_after_passes": self.passes.facts_after["vision"]["image_tokens"],
            "dims_after_passes": plan_dims(self.passes.facts_after, self.recipe.envelope),
        }


def make_plan(recipe_path: str | Path) -> Plan:
    """Validate everything that can be validated without exporting: recipe, model source, passes, backends."""
    quiet_libraries()
    recipe, recipe_dir = load_recipe(recipe_path)
    source = recipe.model.model_dump_json(exclude_none=True)
    with stage("reading the model's configs and tokenizer", key=f"describe {source}"):
        facts = fit_envelope(describe_source(recipe.model, recipe_dir), recipe.envelope)
    passes = plan_passes(recipe, set(FRONTEND_PROPERTIES), set(COMPONENTS), facts)
    partitions = assign_backends(recipe.partition, list(COMPONENTS))
    plan_dims(passes.facts_after, recipe.envelope)
    calibration = load_recipe_data(recipe.calibration, recipe_dir)
    check_recipe_data(passes.passes, calibration)
    suite_data = load_suite_data(recipe.evaluate, recipe.eval_suites(), recipe_dir)
    check_engine_targets(recipe.output.engines)
    return Plan(recipe, recipe_dir, facts, passes, partitions, calibration, suite_data)


def stage_bundle(plan: Plan, ir: ModelIR, reports: list[dict], folder: Path) -> dict[str, Any]:
    """Write every artifact and the manifest of `ir` into `folder`; returns the manifest."""
    dims = plan_dims(ir.config, plan.recipe.envelope)
    stored = StoredTensors(folder)  # the components' tensors, which their segments' files read too
    files = writer.write_artifacts(ir, folder, plan.recipe.output.external_data_threshold, stored)
    manifest = _manifest(plan, ir, [_without_times(r) for r in reports], dims, plan_profiles(ir, dims), files)
    manifest.update(engine_sections(ir, plan.recipe, dims, folder, files, stored))
    writer.write_manifest(folder, manifest)
    return manifest


def compile_recipe(recipe_path: str | Path, out: str | Path, force: bool = False, dump_dir: Path | None = None,
                   device: str = "auto") -> Path:
    """Compile a recipe into a bundle folder at `out`; nothing is left at `out` if any step fails. `device`:
    where calibration runs (`auto`: CUDA when a GPU is visible)."""
    started = time.perf_counter()
    plan = make_plan(recipe_path)
    with writer.staging_folder(Path(out), force) as folder, export.on_device(export.resolve_device(device)), \
            source_weights.kept(), spill.scratch(folder):
        with stage("loading the model", key=f"load {facts_digest(plan.facts)}"):
            model, processor = load_source(plan.recipe.model, plan.recipe_dir, own_dtype=True)
        ir = lower(model, processor)
        model = _kept_source(plan, model)
        ir.config = fit_envelope(ir.config, plan.recipe.envelope)
        annotate(ir, plan.recipe.partition)
        verify_ir(ir)
        instruments = [Timer(), Verify()] + ([Dump(dump_dir)] if dump_dir else [])
        evaluator = _evaluator(plan, (model, processor))
        if evaluator:
            evaluator.measure_baseline(ir)
            instruments.append(evaluator)
        with recipe_data(plan.calibration), source_model(model, processor):
            reports = run_passes(plan.passes.passes, ir, instruments)
        evaluation = evaluator.summary() if evaluator else None
        with stage("writing the bundle", key=f"write {facts_digest(plan.passes.facts_after)}"):
            manifest = stage_bundle(plan, ir, reports, folder)
        if evaluation:
            manifest["evaluation"] = evaluation
            writer.write_manifest(folder, manifest)
            check_budgets(plan.recipe.budgets, evaluation)
        engines = ship_engines(folder, plan.recipe.output.engines)
        writer.write_build_report(folder, {
            **({"engines": engines} if engines else {}),
            "compile_seconds": round(time.perf_counter() - started, 2),
            "host": platform.node(),
            "pass_times_ms": {f"{i}:{r['pass']}": r.get("time_ms") for i, r in enumerate(reports)},
            "pass_phase_times_s": {f"{i}:{r['pass']}": times for i, r in enumerate(reports) if (times := _times(r))},
        })
    return Path(out)


def _times(report: dict) -> dict[str, dict]:
    """The wall times a pass's report gives per component (its phases')."""
    changes = report.get("changes")
    return {c: r[TIMES] for c, r in changes.items() if isinstance(r, dict) and TIMES in r} \
        if isinstance(changes, dict) else {}


def _without_times(report: dict) -> dict:
    """A pass's report as the manifest holds it: without its wall times, which differ from run to run."""
    out = {k: v for k, v in report.items() if k != "time_ms"}
    if isinstance(out.get("changes"), dict):
        out["changes"] = {c: {k: v for k, v in r.items() if k != TIMES} if isinstance(r, dict) else r
                          for c, r in out["changes"].items()}
    return out


def _kept_source(plan: Plan, model):
    """The source model in float32 where the compile reads it after lowering (an evaluation, recover's
    distillation, awq_int4's Fisher sensitivity), else None: its weights are freed before the passes run."""
    reads = plan.recipe.eval_suites() or any(
        p.name == "recover" or getattr(p.config, "sensitivity", None) == "fisher" for p in plan.passes.passes)
    if reads:
        return model.float()
    del model
    gc.collect()
    return None


def _evaluator(plan: Plan, source) -> Evaluate | None:
    suites = plan.recipe.eval_suites()
    if not suites:
        return None
    options = suite_options(plan.recipe.evaluate, plan.suite_data or {}, source)
    return Evaluate(suites, options, lambda ir, folder: stage_bundle(plan, ir, [], folder))


def _manifest(plan: Plan, ir: ModelIR, reports, dims, profiles, files) -> dict[str, Any]:
    components = {
        name: {**files[name], "inputs": [s.to_json() for s in c.inputs], "outputs": [s.to_json() for s in c.outputs]}
        for name, c in ir.components.items()
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "mmtrt_version": __version__,
        "toolchain": toolchain_versions(),
        "recipe": plan.recipe.model_dump(),
        "recipe_sha256": plan.recipe.digest(),
        "model": ir.config,
        "envelope": plan.recipe.envelope.model_dump(),
        "components": components,
        "partitions": plan.partitions,
        "dims": dims,
        "profiles": profiles,
        "passes": reports,
        **({"calibration_data": plan.calibration.summary()} if plan.calibration else {}),
        "properties": sorted(ir.properties),
        "image_token_rules": {"placeholder": ir.config["image_token"], "token_id": ir.config["image_token_id"],
                              "tokens_per_image": ir.config["vision"]["image_tokens"]},
    }
