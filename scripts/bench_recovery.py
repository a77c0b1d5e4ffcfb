"""recover after each lossy pass on zoo:dino-smollm: digits accuracy and perplexity with and without it, in one run.

The model is lowered once with the lossless passes of recipes/dino-smollm.yaml (every partition on ONNX Runtime);
each lossy configuration runs on a copy of the IR and is written as a real bundle by the compiler's `stage_bundle`,
then `recover` runs on that same IR (the source model current, as under `mmtrt compile`) and it is written again.
Digits: held-out images (recover trains on the train split only); perplexity: the perplexity suite's windows of
Python's documentation and of licence texts calibration never saw (recover reads no text). Pass seconds (the lossy
pass's, recover's) are wall time on this machine.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import yaml  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_int4_trt import LICENCES  # noqa: E402
from mmtrt.compiler import Plan, stage_bundle  # noqa: E402
from mmtrt.eval.suites import run_suite  # noqa: E402
from mmtrt.ir.frontend import COMPONENTS, FRONTEND_PROPERTIES, load_source, lower  # noqa: E402
from mmtrt.partition.assign import assign_backends  # noqa: E402
from mmtrt.partition.placement import annotate  # noqa: E402
from mmtrt.pipeline.registry import get_pass  # noqa: E402
from mmtrt.pipeline.runner import plan_passes, run_passes  # noqa: E402
from mmtrt.pipeline.source import source_model  # noqa: E402
from mmtrt.recipe import load_recipe  # noqa: E402
from mmtrt.runtime import load  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "dino-smollm.yaml"
ORT_ONLY = {"preprocess": ["torchvision"], "vision": ["onnxruntime"], "embed": ["onnxruntime"], "llm": ["onnxruntime"]}
LOSSY = {
    "awq_int4 default": ("awq_int4", {}),
    "channel_prune llm mlp 0.2": ("channel_prune", {"llm": {"mlp": 0.2}}),
    "token_prune keep 0.25": ("token_prune", {"keep": 0.25}),
}


def quality(path: Path, args, other: Path, perplexity_of: dict | None = None) -> dict:
    """Digits, and perplexity on Python's documentation and on the unseen licence texts; a row that changed only
    the vision graph (recover) takes its base row's perplexities (the perplexity suite shows no image)."""
    pipe = load(path, threads=args.threads, spin=False)
    digits = run_suite(pipe, "digits", args.digits)["metrics"]["accuracy_pct"]
    if perplexity_of:
        return {"ppl": perplexity_of["ppl"], "ppl_other": perplexity_of["ppl_other"], "digits": digits}
    return {"ppl": run_suite(pipe, "perplexity", args.windows)["metrics"]["perplexity"],
            "ppl_other": run_suite(pipe, "perplexity", args.windows, text_file=other)["metrics"]["perplexity"],
            "digits": digits}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--windows", type=int, default=4, help="perplexity windows of 512 tokens")
    parser.add_argument("--digits", type=int, default=200, help="held-out digit images")
    parser.add_argument("--recover", default="{}", help="recover's config, as YAML")
    parser.add_argument("--only", nargs="*", choices=list(LOSSY), help="lossy configurations to run (default all)")
    args = parser.parse_args(argv)
    recover_config = yaml.safe_load(args.recover) or {}
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        data = {**yaml.safe_load(RECIPE.read_text()), "partition": ORT_ONLY}
        (Path(tmp) / "recipe.yaml").write_text(yaml.safe_dump(data))
        recipe, recipe_dir = load_recipe(Path(tmp) / "recipe.yaml")
        model, processor = load_source(recipe.model, recipe_dir)
        base = lower(model, processor)
        annotate(base, recipe.partition)
        passes = plan_passes(recipe, set(FRONTEND_PROPERTIES), set(COMPONENTS))
        run_passes(passes.passes, base, [])
        plan = Plan(recipe, recipe_dir, base.config, passes, assign_backends(recipe.partition, list(COMPONENTS)))

        other = Path(tmp) / "licences.txt"
        other.write_text("\n\n".join(p.read_text() for p in LICENCES))

        def measured(ir, label: str, perplexity_of: dict | None = None) -> dict:
            folder = Path(tmp) / label.replace(" ", "_")
            folder.mkdir()
            stage_bundle(plan, ir, [], folder)
            row = {"config": label, **quality(folder, args, other, perplexity_of)}
            print(f"  {row}", flush=True)
            return row

        rows = [measured(base, "fp32")]
        for label in args.only or LOSSY:
            name, config = LOSSY[label]
            ir = copy.deepcopy(base)
            cls = get_pass(name)
            start = time.perf_counter()
            with source_model(model, processor):
                cls(cls.Config.model_validate(config)).run(ir)
            seconds = time.perf_counter() - start
            rows.append({**measured(ir, label), "seconds": seconds})
            recover = get_pass("recover")
            start = time.perf_counter()
            with source_model(model, processor):
                report = recover(recover.Config.model_validate(recover_config)).run(ir)
            seconds = time.perf_counter() - start
            rows.append({**measured(ir, f"{label} + recover", rows[-1]), "seconds": seconds, "report": report})
            print(f"  recover: {report}", flush=True)
            del ir
    print_table(rows, args)
    return 0


def print_table(rows: list[dict], args) -> None:
    fp32 = rows[0]
    print(f"\ndino-smollm: digits accuracy over {args.digits} held-out images, perplexity over {args.windows} x 512 "
          f"tokens; threads={args.threads}, shared machine")
    print("| config | digits acc % | drop vs fp32 (points) | ppl Python docs (x fp32) | ppl licence texts, unseen "
          "(x fp32) | recover held-out KL before -> after | pass s |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for r in rows:
        rep = r.get("report")
        kl = f"{rep['heldout_loss_before']:.4g} -> {rep['heldout_loss_after']:.4g}" if rep else "-"
        secs = f"{r['seconds']:.0f}" if "seconds" in r else "-"
        print(f"| {r['config']} | {r['digits']:.1f} | {fp32['digits'] - r['digits']:.1f} | {r['ppl']:.3f} "
              f"({r['ppl'] / fp32['ppl']:.3f}x) | {r['ppl_other']:.3f} ({r['ppl_other'] / fp32['ppl_other']:.3f}x) | "
              f"{kl} | {secs} |")
    slowest = max((r["seconds"] for r in rows if "report" in r), default=0)
    print(f"aim recovery under 10 min: {'met' if slowest < 600 else 'missed'} (slowest {slowest:.0f} s)")
    pruned = [r for r in rows if r["config"] == "channel_prune llm mlp 0.2 + recover"]
    if pruned:
        drop = fp32["digits"] - pruned[0]["digits"]
        print(f"aim LLM MLP 0.2 within 5 points after recovery: {'met' if drop <= 5 else 'missed'} ({drop:.1f} points)")


if __name__ == "__main__":
    sys.exit(main())
