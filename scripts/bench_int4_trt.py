"""TensorRT-compatible INT4 (symmetric, group 128) on zoo:dino-smollm: today's AWQ against GPTQ, AWQ + GPTQ, mixed
precision under a size budget and the int8 token embedding, side by side in one run.

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
from mmtrt.ir.frontend import COMPONENTS, FRONTEND_PROPERTIES  # noqa: E402
from mmtrt.ir.graph import ModelIR  # noqa: E402
from mmtrt.partition.assign import assign_backends  # noqa: E402
from mmtrt.pipeline.runner import plan_passes  # noqa: E402
from mmtrt.quant.embedding import int8_embedding  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
from passes.quant.awq_int4 import AwqInt4  # noqa: E402

LICENCES = [Path("/usr/share/common-licenses") / n for n in ("GPL-3", "GFDL-1.3", "Apache-2.0")]
INT8 = {"embedding": "int8"}
# label -> awq_int4 config (None: fp32; "embedding only": fp32 LLM with the int8 embedding)
CONFIGS = {  # the most wanted first: a run cut short still has them
    "fp32": None,
    "awq sym g128 (today's default)": {},
    "awq_gptq sym g128, float budget 16 MiB, int8 embedding": {"method": "awq_gptq", "float_budget_mib": 16, **INT8},
    "awq_gptq sym g128": {"method": "awq_gptq"},
    "gptq sym g128": {"method": "gptq"},
    "fp32, int8 embedding": "embedding only",
    "awq_gptq sym g128, float budget 16 MiB": {"method": "awq_gptq", "float_budget_mib": 16},
}


class Variants(Model):
    def variant(self, label: str, how) -> tuple[Path, dict, float | None]:
        """The bundle of one configuration, the pass's report and its quantization seconds."""
        folder = self.folder / "".join(c if c.isalnum() else "_" for c in label)
        recipe, recipe_dir = self._recipe(None, folder)
        plan = Plan(recipe, recipe_dir, self.ir.config, plan_passes(recipe, set(FRONTEND_PROPERTIES), set(COMPONENTS)),
                    assign_backends(recipe.partition, list(COMPONENTS)))
        base = self.ir
        ir = ModelIR({**base.components, **{n: copy.deepcopy(base.components[n]) for n in ("embed", "llm")}},
                     copy.deepcopy(base.config), dict(base.assets), set(base.properties))
        report, seconds, start = {}, None, time.perf_counter()
        if how == "embedding only":
            report = {"embed": int8_embedding(ir.components["embed"].onnx)}
        elif how is not None:
            report = AwqInt4(AwqInt4.Config.model_validate({**LEVEL0, **how})).run(ir)
            seconds = time.perf_counter() - start
        (folder / "bundle").mkdir()
        stage_bundle(plan, ir, [], folder / "bundle")
        return folder / "bundle", report, seconds


def measure(label: str, path: Path, report: dict, seconds: float | None, args, other: Path) -> dict:
    pipe = load(path, threads=args.threads, spin=False)
    llm = report.get("llm", {})
    if llm:
        own = (f"; own-output rel. MSE RTN {llm['own_rtn_rel_mse_mean']} -> {llm['own_final_rel_mse_mean']} "
               f"({llm['linears_below_rtn_at_own_outputs']} of {llm['linears_quantized']} below RTN)"
               if "own_rtn_rel_mse_mean" in llm else "")
        print(f"  {label}: module rel. MSE RTN {llm['rtn_rel_mse_mean']} -> {llm['final_rel_mse_mean']}{own}; "
              f"kept float: {llm.get('kept_float', [])}", flush=True)
    row = {"label": label, "bundle": folder_bytes(path), "seconds": seconds,
           "digits": run_suite(pipe, "digits", args.digits)["metrics"]["accuracy_pct"],
           "ppl_doc": run_suite(pipe, "perplexity", args.windows)["metrics"]["perplexity"],
           "ppl_other": run_suite(pipe, "perplexity", args.windows, text_file=other)["metrics"]["perplexity"]}
    print(f"  measured {row}", flush=True)
    return row


def table(rows: list[dict], args) -> None:
    fp32 = rows[0]
    print(f"\n{args.digits} held-out digits; perplexity over {args.windows} x 512 tokens of each text")
    print("| config | digits acc % (pts vs fp32) | ppl Python docs (x fp32) | ppl licence texts, unseen (x fp32) | "
          "bundle MiB (x smaller) | quantize s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        seconds = "-" if r["seconds"] is None else f"{r['seconds']:.0f}"
        print(f"| {r['label']} | {r['digits']:.1f} ({r['digits'] - fp32['digits']:+.1f}) | "
              f"{r['ppl_doc']:.3f} ({r['ppl_doc'] / fp32['ppl_doc']:.3f}x) | "
              f"{r['ppl_other']:.3f} ({r['ppl_other'] / fp32['ppl_other']:.3f}x) | "
              f"{r['bundle'] / 2**20:.1f} ({fp32['bundle'] / r['bundle']:.2f}x) | {seconds} |", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--windows", type=int, default=8, help="perplexity windows of 512 tokens per text")
    parser.add_argument("--digits", type=int, default=200, help="held-out digit images")
    parser.add_argument("--only", nargs="*", help="labels to run (fp32 always runs first)")
    args = parser.parse_args(argv)
    print(f"threads={args.threads}, spinning off; the machine is shared with other jobs")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-int4-trt-") as tmp:
        other = Path(tmp) / "licences.txt"
        other.write_text("\n\n".join(p.read_text() for p in LICENCES))
        model = Variants({"source": "zoo", "name": "dino-smollm"}, Path(tmp) / "dino")
        for label, how in CONFIGS.items():
            if args.only and label != "fp32" and label not in args.only:
                continue
            path, report, seconds = model.variant(label, how)
            rows.append(measure(label, path, report, seconds, args, other))
            shutil.rmtree(path)
    table(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
