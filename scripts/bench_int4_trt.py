"""TensorRT-compatible INT4 (symmetric, group 128) on zoo:dino-smollm: today's AWQ against GPTQ, AWQ + GPTQ, mixed
precision under a size budget, the int8 token embedding, `recover` (the projector refitted to the INT4 LLM) and
`int8_weights` on the vision tower, side by side in one run; each row is printed (and appended to --rows) as it
finishes, so that a run stopped early still yields its rows.

zoo:dino-smollm is lowered once with the lossless passes of recipes/dino-smollm.yaml, every partition on ONNX
Runtime; each configuration quantizes copies of the LLM and embed graphs with the pass itself (every linear,
lm_head included unless noted; MatMulNBits at accuracy level 0, the same weights TensorRT's DequantizeLinear form
holds) and is written as a real bundle by the compiler's own `stage_bundle`. Measured per bundle: digits accuracy on
held-out images, perplexity on windows of Python's documentation (calibration's domain: it reads other windows of
the same text) and on English text of another domain that calibration never saw (the GPL-3, GFDL-1.3 and Apache-2.0
licence texts shipped in /usr/share/common-licenses: legal prose), bundle bytes (embedding counted) and quantization
seconds.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_awq import LEVEL0, Model, folder_bytes  # noqa: E402
from mmtrt.compiler import Plan, stage_bundle  # noqa: E402
from mmtrt.eval.suites import run_suite  # noqa: E402
from mmtrt.ir.frontend import COMPONENTS, FRONTEND_PROPERTIES, load_source, lower  # noqa: E402
from mmtrt.ir.graph import ModelIR  # noqa: E402
from mmtrt.partition.assign import assign_backends  # noqa: E402
from mmtrt.partition.placement import annotate  # noqa: E402
from mmtrt.pipeline.runner import plan_passes, run_passes  # noqa: E402
from mmtrt.pipeline.source import source_model  # noqa: E402
from mmtrt.quant.embedding import int8_embedding  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
from passes.quant.awq_int4 import AwqInt4  # noqa: E402
from passes.quant.int8_weights import Int8Weights  # noqa: E402
from passes.recover.recover import Recover  # noqa: E402

LICENCES = [Path("/usr/share/common-licenses") / n for n in ("GPL-3", "GFDL-1.3", "Apache-2.0")]
INT8 = {"embedding": "int8"}
SHIPPED = {"method": "awq_gptq", "float_budget_mib": 16, **INT8}
RECOVER = {"samples": 64, "heldout": 32, "epochs": 3, "batch": 4}
# act-order with 64 calibration images; the fp16 budget is what int8 vision leaves under 3.5x smaller than fp32
ACT = {"method": "awq_gptq", "act_order": True, "calibration": {"samples": 64}, "float_budget_mib": 72, **INT8}
ACT64 = "awq_gptq act-order sym g128, int8 embedding, 64 calibration images"
ACT_BUDGET = "awq_gptq act-order sym g128, fp16 budget 72 MiB, int8 embedding, 64 calibration images"
ACT_FISHER = "awq_gptq act-order sym g128, fp16 budget 72 MiB by Fisher, int8 embedding, 64 calibration images"
# label -> what the row does: `awq` (awq_int4's config; None: fp32; "embedding only": fp32 with the int8 embedding),
# or `after` (a row above: its IR) then `recover` (recover's config) and/or `int8_vision` (int8_weights on vision)
CONFIGS = {  # the most wanted first: a run cut short still has them
    "fp32": {"awq": None},
    "awq sym g128 (today's default)": {"awq": {}},
    "awq_gptq sym g128, float budget 16 MiB, int8 embedding": {"awq": SHIPPED},
    "  + recover (64 images, lr 1e-4)": {"after": "awq_gptq sym g128, float budget 16 MiB, int8 embedding",
                                         "recover": {**RECOVER, "lr": 1e-4}},
    "  + recover (64 images, lr 3e-5)": {"after": "awq_gptq sym g128, float budget 16 MiB, int8 embedding",
                                         "recover": {**RECOVER, "lr": 3e-5}},
    "  + int8 vision tower": {"after": "awq_gptq sym g128, float budget 16 MiB, int8 embedding", "int8_vision": True},
    "awq_gptq sym g128": {"awq": {"method": "awq_gptq"}},
    "awq_gptq act-order sym g128, int8 embedding": {"awq": {"method": "awq_gptq", "act_order": True, **INT8}},
    ACT64: {"awq": {**ACT, "float_budget_mib": 0}},
    ACT_BUDGET: {"awq": {**ACT, "float_dtype": "float16"}},
    ACT_FISHER: {"awq": {**ACT, "float_dtype": "float16", "sensitivity": "fisher"}},
    "  + recover (64 images, lr 3e-5), int8 vision tower (budget by output error)": {
        "after": ACT_BUDGET, "recover": {**RECOVER, "lr": 3e-5}, "int8_vision": True},
    "  + recover (64 images, lr 3e-5), int8 vision tower (budget by Fisher)": {
        "after": ACT_FISHER, "recover": {**RECOVER, "lr": 3e-5}, "int8_vision": True},
    "  + int8 vision tower (budget by output error)": {"after": ACT_BUDGET, "int8_vision": True},
    "  + int8 vision tower (budget by Fisher)": {"after": ACT_FISHER, "int8_vision": True},
    "awq_gptq sym g128, int8 embedding, 64 calibration images": {
        "awq": {"method": "awq_gptq", **INT8, "calibration": {"samples": 64}}},
    "awq_gptq sym g128, lm_head float, int8 embedding": {"awq": {"method": "awq_gptq", "exclude": ["llm.lm_head"], **INT8}},
    "awq_gptq sym g128, float budget 32 MiB, int8 embedding": {"awq": {**SHIPPED, "float_budget_mib": 32}},
    "gptq sym g128": {"awq": {"method": "gptq"}},
    "fp32, int8 embedding": {"awq": "embedding only"},
    "awq_gptq sym g128, float budget 16 MiB": {"awq": {"method": "awq_gptq", "float_budget_mib": 16}},
    "awq sym g128 + recover (64 images, lr 1e-4)": {"after": "awq sym g128 (today's default)",
                                                    "recover": {**RECOVER, "lr": 1e-4}},
}


class Variants(Model):
    def __init__(self, source: dict, folder: Path):
        self.source, self.folder = source, folder
        recipe, recipe_dir = self._recipe(None, folder)
        self.llava = load_source(recipe.model, recipe_dir)
        self.ir = lower(*self.llava)
        annotate(self.ir, recipe.partition)
        run_passes(plan_passes(recipe, set(FRONTEND_PROPERTIES), set(COMPONENTS)).passes, self.ir, [])
        self.kept: dict[str, ModelIR] = {}

    def variant(self, label: str, spec: dict) -> tuple[Path, dict, float | None]:
        """The bundle of one configuration, the passes' reports and their seconds."""
        folder = self.folder / "".join(c if c.isalnum() else "_" for c in label)
        recipe, recipe_dir = self._recipe(None, folder)
        plan = Plan(recipe, recipe_dir, self.ir.config, plan_passes(recipe, set(FRONTEND_PROPERTIES), set(COMPONENTS)),
                    assign_backends(recipe.partition, list(COMPONENTS)))
        base = self.kept.get(spec.get("after"), self.ir)
        copied = (("embed", "llm") if spec.get("awq") is not None else ()) + \
            (("vision",) if "recover" in spec or spec.get("int8_vision") else ())
        ir = ModelIR({**base.components, **{n: copy.deepcopy(base.components[n]) for n in copied}},
                     copy.deepcopy(base.config), dict(base.assets), set(base.properties))
        report, start = {}, time.perf_counter()
        if spec.get("awq") == "embedding only":
            report = {"embed": int8_embedding(ir.components["embed"].onnx)}
        elif spec.get("awq") is not None:
            with source_model(*self.llava):
                report = AwqInt4(AwqInt4.Config.model_validate({**LEVEL0, **spec["awq"]})).run(ir)
        if "recover" in spec:
            with source_model(*self.llava):
                report["recover"] = Recover(Recover.Config.model_validate(spec["recover"])).run(ir)
        if spec.get("int8_vision"):
            report["int8_vision"] = Int8Weights(Int8Weights.Config()).run(ir)["vision"]
        timed = "recover" in spec or isinstance(spec.get("awq"), dict)
        seconds = time.perf_counter() - start if timed else None
        if any(s.get("after") == label for s in CONFIGS.values()):
            self.kept[label] = ir
        (folder / "bundle").mkdir()
        stage_bundle(plan, ir, [], folder / "bundle")
        return folder / "bundle", report, seconds


def measure(label: str, path: Path, report: dict, seconds: float | None, args, other: Path,
            perplexity_of: dict | None) -> dict:
    """One row; a row that changed only the vision graph takes its base row's perplexities (the perplexity suite
    shows no image, so they cannot differ)."""
    pipe = load(path, threads=args.threads, spin=False)
    llm = report.get("llm", {})
    if llm:
        own = (f"; own-output rel. MSE RTN {llm['own_rtn_rel_mse_mean']} -> {llm['own_final_rel_mse_mean']} "
               f"({llm['linears_below_rtn_at_own_outputs']} of {llm['linears_quantized']} below RTN)"
               if "own_rtn_rel_mse_mean" in llm else "")
        print(f"  {label}: module rel. MSE RTN {llm['rtn_rel_mse_mean']} -> {llm['final_rel_mse_mean']}{own}; "
              f"kept float: {llm.get('kept_float', [])}", flush=True)
    for key in ("recover", "int8_vision"):
        if key in report:
            print(f"  {label}: {key} {report[key]}", flush=True)
    rec = report.get("recover")
    row = {"label": label, "bundle": folder_bytes(path), "seconds": seconds,
           "digits": run_suite(pipe, "digits", args.digits)["metrics"]["accuracy_pct"],
           "recover_kl": [rec["heldout_loss_before"], rec["heldout_loss_after"]] if rec else None}
    if perplexity_of:
        row.update(ppl_doc=perplexity_of["ppl_doc"], ppl_other=perplexity_of["ppl_other"])
    else:
        row.update(ppl_doc=run_suite(pipe, "perplexity", args.windows)["metrics"]["perplexity"],
                   ppl_other=run_suite(pipe, "perplexity", args.windows, text_file=other)["metrics"]["perplexity"])
    print(f"  measured {row}", flush=True)
    return row


HEADER = ("| config | digits acc % (pts vs fp32) | ppl Python docs (x fp32) | ppl licence texts, unseen (x fp32) | "
          "bundle MiB (x smaller) | quantize / recover s (shared machine) | recover held-out KL before -> after |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | --- |")


def table_row(r: dict, fp32: dict) -> str:
    seconds = "-" if r["seconds"] is None else f"{r['seconds']:.0f}"
    kl = "-" if not r.get("recover_kl") else f"{r['recover_kl'][0]:.4g} -> {r['recover_kl'][1]:.4g}"
    return (f"| {r['label']} | {r['digits']:.1f} ({r['digits'] - fp32['digits']:+.1f}) | "
            f"{r['ppl_doc']:.3f} ({r['ppl_doc'] / fp32['ppl_doc']:.3f}x) | "
            f"{r['ppl_other']:.3f} ({r['ppl_other'] / fp32['ppl_other']:.3f}x) | "
            f"{r['bundle'] / 2**20:.1f} ({fp32['bundle'] / r['bundle']:.2f}x) | {seconds} | {kl} |")


def table(rows: list[dict], args) -> None:
    print(f"\n{args.digits} held-out digits; perplexity over {args.windows} x 512 tokens of each text")
    print(HEADER)
    for r in rows:
        print(table_row(r, rows[0]), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--windows", type=int, default=8, help="perplexity windows of 512 tokens per text")
    parser.add_argument("--digits", type=int, default=200, help="held-out digit images")
    parser.add_argument("--only", nargs="*", help="labels to run (fp32 always runs first, and the row a chosen one "
                        "starts from)")
    parser.add_argument("--rows", help="append each row as a JSON line to this file as soon as it is measured")
    parser.add_argument("--fp32-from", help="a --rows file of an earlier run on this machine: its fp32 row is the "
                        "reference instead of measuring fp32 again")
    args = parser.parse_args(argv)
    print(f"threads={args.threads}, spinning off; the machine is shared with other jobs")
    rows = []
    if args.fp32_from:
        rows = [next(r for r in map(json.loads, Path(args.fp32_from).read_text().splitlines()) if r["label"] == "fp32")]
        print(table_row(rows[0], rows[0]), f"(from {args.fp32_from})", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-int4-trt-") as tmp:
        other = Path(tmp) / "licences.txt"
        other.write_text("\n\n".join(p.read_text() for p in LICENCES))
        model = Variants({"source": "zoo", "name": "dino-smollm"}, Path(tmp) / "dino")
        for label, spec in CONFIGS.items():
            wanted = (not args.only or label == "fp32" or label in args.only) and not (label == "fp32" and rows)
            if not wanted and not any(CONFIGS[o].get("after") == label for o in args.only):
                continue
            path, report, seconds = model.variant(label, spec)
            if wanted:
                base = next((r for r in rows if r["label"] == spec.get("after")), None)
                rows.append(measure(label, path, report, seconds, args, other, base))
                print(table_row(rows[-1], rows[0]), flush=True)
                if args.rows:
                    with open(args.rows, "a") as f:
                        f.write(json.dumps(rows[-1]) + "\n")
            shutil.rmtree(path)
    table(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
