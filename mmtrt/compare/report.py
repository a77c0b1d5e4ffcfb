"""Run a comparison and present it: a table per partition and output, the bundle differences, a JSON report.

Polygraphy's SimpleCompareFunc checks element by element: an element fails when its absolute error exceeds
atol and its relative error (relative to the second runner, B or PyTorch) exceeds rtol
(polygraphy/comparator/compare.py). `CompareFunc.simple` is deprecated in Polygraphy 0.53 for SimpleCompareFunc.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from mmtrt.bundle.manifest import bundle_hash, read_manifest
from mmtrt.bundle.verify import verify_bundle
from mmtrt.compare import inputs as compare_inputs
from mmtrt.compare import kv_layouts
from mmtrt.compare.diff import bundle_differences
from mmtrt.compare.runners import TORCH_FAMILIES, CacheRowsRunner, bundle_runner, torch_runner
from mmtrt.errors import UserError
from mmtrt.runtime.executors import engine_choices

PARTITIONS = ("vision", "embed", "llm")


def compare(a: Path, b: Path | None, *, reference: str | None = None, atol: float = 1e-5, rtol: float = 1e-5,
            components: list[str] | None = None, inputs_file: Path | None = None, save_inputs: Path | None = None,
            seed: int | None = None, source_model: Path | None = None) -> dict[str, Any]:
    """Compare bundle `a` with bundle `b`, or with its PyTorch source (`reference="torch"`)."""
    if (b is None) == (reference is None):
        raise UserError("compare needs a second bundle or --reference torch (not both)")
    ma = read_manifest(Path(a))
    mb = read_manifest(Path(b)) if b is not None else None
    for bundle, manifest in ((a, ma), (b, mb)):
        if manifest is not None:
            verify_bundle(bundle, manifest)
    if b is None and ma["model"]["architecture"] not in TORCH_FAMILIES:
        raise UserError(f"compare --reference torch runs the components of {', '.join(TORCH_FAMILIES)} models, not "
                        f"{ma['model']['architecture']}; check this bundle against transformers with "
                        "`mmtrt eval BUNDLE --suite parity --source-model FOLDER`")
    components = _components(components)
    seed = int(np.random.SeedSequence().entropy % (1 << 63)) if seed is None else seed
    feeds = (compare_inputs.load(inputs_file, ma, components) if inputs_file else
             {c: compare_inputs.generate(ma, c, np.random.default_rng([seed, i])) for i, c in enumerate(components)})
    if save_inputs:
        compare_inputs.save(save_inputs, {c: feeds[c] for c in components})
    side_b = _side_b(b, mb, ma, source_model)
    side_a = _bundle_side(Path(a), ma, "A")
    partitions = {c: _compare_partition(c, side_a, side_b, ma, mb or ma, feeds, atol, rtol) for c in components}
    report = {
        "a": {"bundle": str(a), "sha256": bundle_hash(Path(a))},
        "b": {"bundle": str(b), "sha256": bundle_hash(Path(b))} if b is not None else {"reference": reference},
        "tolerances": {"atol": atol, "rtol": rtol},
        "inputs": {"file": str(inputs_file)} if inputs_file else {"seed": seed},
        "partitions": partitions,
        "differences": bundle_differences(ma, mb) if mb is not None else [],
    }
    report["passed"] = all(p["passed"] for p in partitions.values())
    return report


def _components(requested: list[str] | None) -> list[str]:
    components = list(requested or PARTITIONS)
    unknown = sorted(set(components) - set(PARTITIONS))
    if unknown:
        raise UserError(f"unknown partition {', '.join(unknown)}; choose from {', '.join(PARTITIONS)}")
    return components


def _bundle_side(bundle: Path, manifest: dict, label: str):
    choices = engine_choices(bundle, manifest)

    def side(comp: str):
        runner, what = bundle_runner(bundle, manifest, comp, choices, f"{label}:{comp}")
        if kv_layouts.rewritten(manifest, comp):
            runner = CacheRowsRunner(runner, manifest)
        return runner, what

    return side


def _side_b(b: Path | None, mb, ma, source_model: Path | None):
    if b is not None:
        return _bundle_side(Path(b), mb, "B")
    from mmtrt.eval.source import source_model as load_source_model

    model, _ = load_source_model(ma, source_model, own_dtype=True)  # widened a partition at a time (runners.py)
    return lambda comp: torch_runner(model, ma, comp, f"torch:{comp}")


def _contract(manifest: dict, comp: str) -> list[tuple]:
    spec = manifest["components"][comp]
    return [(s["name"], s["dtype"], tuple(d if isinstance(d, int) else "?" for d in s["shape"]))
            for s in [*spec["inputs"], *spec["outputs"]]]


def _compare_partition(comp, side_a, side_b, ma, mb, feeds, atol, rtol) -> dict[str, Any]:
    from polygraphy.comparator import Comparator, SimpleCompareFunc
    from polygraphy.logger import G_LOGGER

    if _contract(ma, comp) != _contract(mb, comp):
        return {"passed": False, "comparable": False,
                "reason": f"the {comp} contracts differ: A {_contract(ma, comp)} vs B {_contract(mb, comp)}"}
    if not feeds.get(comp):
        return {"passed": False, "comparable": False, "reason": f"the inputs file has no inputs for {comp}"}
    (runner_a, what_a), (runner_b, what_b) = side_a(comp), side_b(comp)
    with G_LOGGER.verbosity():  # the report below says what matters; Polygraphy would repeat it per element
        results = Comparator.run([runner_a, runner_b], data_loader=feeds[comp], warm_up=1)
        accuracy = Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=atol, rtol=rtol))
    iterations = accuracy[0][(runner_a.name, runner_b.name)]
    outputs = {}
    for name in iterations[0]:
        stats = [it[name] for it in iterations]
        outputs[name] = {"max_abs": max(s.max_absdiff for s in stats), "max_rel": max(s.max_reldiff for s in stats),
                         "mean_abs": float(np.mean([s.mean_absdiff for s in stats])),
                         "passed": all(bool(s) for s in stats)}
    times = {label: round(1e3 * statistics.median(r.runtime for r in run), 3)
             for label, (_, run) in zip(("a", "b"), results)}
    return {"passed": all(o["passed"] for o in outputs.values()), "comparable": True, "runners": {"a": what_a, "b": what_b},
            "iterations": len(iterations), "median_ms": times, "outputs": outputs}


def format_report(report: dict[str, Any]) -> str:
    t = report["tolerances"]
    b = report["b"].get("bundle") or f"the PyTorch source ({report['b']['reference']})"
    lines = [f"A {report['a']['bundle']} vs B {b}: atol {t['atol']:g}, rtol {t['rtol']:g} "
             "(an element fails when it exceeds both; relative to B)"]
    for comp, p in report["partitions"].items():
        lines.append("")
        if not p["comparable"]:
            lines.append(f"{comp}: NOT COMPARED, {p['reason']}")
            continue
        lines.append(f"{comp}: A {p['runners']['a']} {p['median_ms']['a']} ms, B {p['runners']['b']} "
                     f"{p['median_ms']['b']} ms ({_iterations(p['iterations'])})")
        lines.append(f"  {'output':<20} {'max abs':>10} {'max rel':>10} {'mean abs':>10}  result")
        for name, o in _grouped(p["outputs"]).items():
            lines.append(f"  {name:<20} {o['max_abs']:>10.3g} {o['max_rel']:>10.3g} {o['mean_abs']:>10.3g}  "
                         f"{'pass' if o['passed'] else 'FAIL'}")
    if report["differences"]:
        lines += ["", "differences between the bundles (A | B):"]
        lines += [f"  {d['what']:<14} {d['where']:<8} {d['a']} | {d['b']}" for d in report["differences"]]
    lines += ["", "PASSED" if report["passed"] else "FAILED"]
    return "\n".join(lines)


def _iterations(count: int) -> str:
    return "one iteration" if count == 1 else f"medians of {count} iterations"


def _grouped(outputs: dict[str, dict]) -> dict[str, dict]:
    """The KV cache outputs (present.N.key/value) as one row: worst error, mean of means (the JSON has each)."""
    rows, cache = {}, []
    for name, o in outputs.items():
        if re.fullmatch(r"present\.\d+\.(key|value)", name):
            cache.append(o)
        else:
            rows[name] = o
    if cache:
        rows[f"present.* ({len(cache)})"] = {
            "max_abs": max(o["max_abs"] for o in cache), "max_rel": max(o["max_rel"] for o in cache),
            "mean_abs": float(np.mean([o["mean_abs"] for o in cache])), "passed": all(o["passed"] for o in cache)}
    return rows
