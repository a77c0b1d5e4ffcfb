"""Resolve the recipe's pass list against the registry (at plan time, before heavy work) and run it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from mmtrt.errors import UserError
from mmtrt.ir import resident, source_weights
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.spill import as_made, spill
from mmtrt.pipeline.instruments import Instrument
from mmtrt.pipeline.pass_base import Pass
from mmtrt.pipeline.registry import get_pass
from mmtrt.progress import facts_digest, stage
from mmtrt.recipe import Recipe
from mmtrt.schema_errors import validation_problems


@dataclass
class PassPlan:
    passes: list[Pass]
    properties_after: set[str]
    facts_after: dict[str, Any] | None = None


def plan_passes(recipe: Recipe, properties: set[str], components: set[str],
                facts: dict[str, Any] | None = None) -> PassPlan:
    """Instantiate every pass with its validated config and check the requires/provides chain; given the model
    facts, also follow them through every pass."""
    props = set(properties)
    passes, sealed = [], {}
    for i, (name, raw) in enumerate(recipe.pass_list()):
        cls = get_pass(name)
        where = f"passes[{i}].{name}"
        refused = (facts or {}).get("refused_passes", {}).get(name)
        if refused:
            raise UserError(f"{where} is refused for this model: {refused}")
        try:
            config = cls.Config.model_validate(raw or {})
        except ValidationError as exc:
            raise UserError("; ".join(validation_problems(exc, cls.Config, where))) from None
        missing = sorted(cls.requires - props)
        if missing:
            raise UserError(f"{where} requires {', '.join(missing)}, which the model or an earlier pass must provide; "
                            f"reorder the passes or remove {name}")
        absent = sorted(set(cls.components) - components)
        if absent:
            raise UserError(f"{where} works on components {', '.join(absent)}, which this model lacks; remove {name}")
        _check_unsealed(cls, sealed, where)
        sealed.update(dict.fromkeys(cls.seals, name))
        props = (props - cls.removes) | cls.provides
        passes.append(cls(config))
        if facts is not None:
            facts = _facts_after(passes[-1], facts, where)
    return PassPlan(passes, props, facts)


def _check_unsealed(cls, sealed: dict[str, str], where: str) -> None:
    touched = sorted(set(cls.components) & set(sealed))
    if touched:
        raise UserError(f"{where} rewrites the {touched[0]} component after {sealed[touched[0]]} copied it; put "
                        f"{sealed[touched[0]]} after {cls.name}")


def _facts_after(p: Pass, facts: dict[str, Any], where: str) -> dict[str, Any]:
    try:
        return p.plan_facts(facts)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None


def component_stats(ir: ModelIR, names) -> dict[str, dict[str, int]]:
    return {n: {"nodes": ir.components[n].node_count(), "params": ir.components[n].param_count()} for n in names}


def run_passes(passes: list[Pass], ir: ModelIR, instruments: list[Instrument]) -> list[dict]:
    """Run each pass with every instrument around it, its components' weights in memory (unless the pass reads
    them from the source model itself); a component no later pass lists has the weights its last pass makes, and
    then all its weights, spilled out of memory (mmtrt/ir/spill.py). Returns one report per pass."""
    reports = []
    for i, p in enumerate(passes):
        for name in () if p.reads_source_weights else p.components:
            if ir.components[name].onnx is not None:
                source_weights.materialize(ir.components[name].onnx)
        before = component_stats(ir, p.components)
        for inst in instruments:
            inst.before(p, ir)
        key = f"pass {p.name} {p.config.model_dump_json()} {facts_digest(ir.config)}"
        with stage(f"pass {i + 1}/{len(passes)}: {p.name}", key=key), \
                as_made([c.onnx for c in done_with(ir, passes[i + 1:])]):
            changes = p.run(ir)
        ir.properties = (ir.properties - p.removes) | p.provides
        after = component_stats(ir, p.components)
        report = {
            "pass": p.name,
            "config": p.config.model_dump(),
            "lossy": p.lossy,
            "components": {n: {f"{k}_{w}": s[n][k] for w, s in (("before", before), ("after", after)) for k in s[n]}
                           for n in p.components},
            "changes": changes,
        }
        for inst in reversed(instruments):
            inst.after(p, ir, report)
        reports.append(report)
        for comp in done_with(ir, passes[i + 1:]):
            spill(comp)
        resident.give_back_freed_memory()  # what the pass freed, before the next pass or the writer allocates
    return reports


def done_with(ir: ModelIR, later: list[Pass]) -> list:
    """The components with a graph that none of the `later` passes lists."""
    listed = {name for p in later for name in p.components}
    return [c for name, c in ir.components.items() if c.onnx is not None and name not in listed]
