"""AWQ INT4 weights for the LLM: quality, bytes, decode speed and quantization time, measured in one run.

Two models, each lowered once with the lossless passes of recipes/dino-smollm.yaml and every partition on ONNX
Runtime; every configuration quantizes a copy of the LLM and is written as a real bundle by the compiler's own
`stage_bundle`:
- zoo:dino-smollm (DINOv2 ViT-S/14 + SmolLM2-135M-Instruct, real weights): perplexity on the perplexity suite's
  windows of Python's documentation (calibration reads windows from the other end) and digits accuracy on held-out
  digits. Beside mmtrt's rows, ONNX Runtime's own quantizer (MatMulNBitsQuantizer: RTN symmetric and asymmetric,
  HQQ) on the same LLM graph, every linear at block 128, lm_head included.
- a larger random-weight LLaVA whose LLM (hidden 1536, 8 layers, 0.9 GB in fp32) makes decode weight-bound; its
  weights are random (its logits are chaotic), so quality there is the pass's per-group output error.
Quality is compared at MatMulNBits accuracy level 0 (float activations: the weight quantization alone, as ONNX
Runtime's quantizer writes it by default); the shipped default, level 4 (int8 activations), is measured beside it.
Decode: one step after the digits prompt with a held-out digit (KV cache of the prompt), the bundles timed in turn
within every round, medians; the same thread count, spinning off (OMP_WAIT_POLICY=PASSIVE, allow_spinning=0).
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import yaml  # noqa: E402

from mmtrt.compiler import Plan, stage_bundle  # noqa: E402
from mmtrt.eval import digits  # noqa: E402
from mmtrt.eval.suites import run_suite  # noqa: E402
from mmtrt.ir.frontend import COMPONENTS, FRONTEND_PROPERTIES, load_source, lower  # noqa: E402
from mmtrt.ir.graph import ModelIR  # noqa: E402
from mmtrt.partition.assign import assign_backends  # noqa: E402
from mmtrt.partition.placement import annotate  # noqa: E402
from mmtrt.pipeline.runner import plan_passes, run_passes  # noqa: E402
from mmtrt.recipe import load_recipe  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
from passes.quant.awq_int4 import AwqInt4  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "dino-smollm.yaml"
ORT_ONLY = {"preprocess": ["torchvision"], "vision": ["onnxruntime"], "embed": ["onnxruntime"], "llm": ["onnxruntime"]}
LARGER = dict(image_size=64, patch_size=8, vision_hidden=64, vision_layers=2, hidden=1536, layers=8, heads=12, kv_heads=4)
LEVEL0 = {"lowering": "matmulnbits", "accuracy_level": 0}
DEFAULT = "awq sym g128"
# label -> ("mmtrt", awq_int4 config on top of LEVEL0) | ("ort", MatMulNBitsQuantizer algorithm) | None (FP32)
DINO = {
    "fp32": None,
    "ort rtn sym g128": ("ort", "rtn sym"),
    "ort rtn asym g128": ("ort", "rtn asym"),
    "ort hqq g128": ("ort", "hqq"),
    "rtn sym g128": ("mmtrt", {"method": "rtn"}),
    DEFAULT: ("mmtrt", {}),
    "awq asym g128": ("mmtrt", {"symmetric": False}),
    "awq sym g64": ("mmtrt", {"group_size": 64}),
    "awq sym g32": ("mmtrt", {"group_size": 32}),
    "awq sym g128, lm_head fp32": ("mmtrt", {"exclude": ["llm.lm_head"]}),
    "rtn asym-float g32": ("mmtrt", {"method": "rtn", "group_size": 32, "symmetric": False, "zero_point": "float"}),
    "awq asym-float g32": ("mmtrt", {"group_size": 32, "symmetric": False, "zero_point": "float"}),
    "rtn asym-float g32, lm_head fp32": ("mmtrt", {"method": "rtn", "group_size": 32, "symmetric": False,
                                                   "zero_point": "float", "exclude": ["llm.lm_head"]}),
}
LARGER_CONFIGS = {
    "fp32": None,
    "rtn sym g128": ("mmtrt", {"method": "rtn"}),
    DEFAULT: ("mmtrt", {"calibration": {"samples": 8, "text_windows": 2, "search_tokens": 512}}),
}


class Model:
    """One model lowered with the recipe's lossless passes; `bundle` writes a quantized copy of it."""

    def __init__(self, source: dict, folder: Path):
        self.source, self.folder = source, folder
        recipe, recipe_dir = self._recipe(None, folder)
        self.ir = lower(*load_source(recipe.model, recipe_dir))
        annotate(self.ir, recipe.partition)
        run_passes(plan_passes(recipe, set(FRONTEND_PROPERTIES), set(COMPONENTS)).passes, self.ir, [])

    def _recipe(self, awq: dict | None, folder: Path):
        data = yaml.safe_load(RECIPE.read_text())
        data["model"], data["partition"] = self.source, ORT_ONLY
        data["passes"] += [{"awq_int4": awq}] if awq is not None else []
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "recipe.yaml").write_text(yaml.safe_dump(data))
        return load_recipe(folder / "recipe.yaml")

    def bundle(self, label: str, how) -> tuple[Path, dict, float]:
        """The bundle of one configuration, the pass report's LLM section and the quantization seconds."""
        folder = self.folder / label.replace(" ", "_").replace(",", "")
        recipe, recipe_dir = self._recipe(how[1] if how and how[0] == "mmtrt" else None, folder)
        plan = Plan(recipe, recipe_dir, self.ir.config, plan_passes(recipe, set(FRONTEND_PROPERTIES), set(COMPONENTS)),
                    assign_backends(recipe.partition, list(COMPONENTS)))
        base = self.ir
        ir = ModelIR({**base.components, "llm": copy.deepcopy(base.components["llm"])}, copy.deepcopy(base.config),
                     dict(base.assets), set(base.properties))
        report, start = {}, time.perf_counter()
        if how and how[0] == "mmtrt":
            report = AwqInt4(AwqInt4.Config.model_validate({**LEVEL0, **how[1]})).run(ir)["llm"]
        elif how:
            ir.components["llm"].onnx = ort_quantized(ir.components["llm"].onnx, how[1])
        seconds = time.perf_counter() - start
        (folder / "bundle").mkdir()
        stage_bundle(plan, ir, [], folder / "bundle")
        return folder / "bundle", report, seconds


def ort_quantized(model: onnx.ModelProto, algorithm: str) -> onnx.ModelProto:
    """ONNX Runtime's MatMulNBitsQuantizer on every MatMul with a constant weight, block 128, accuracy level 0."""
    import logging

    from onnxruntime.quantization import matmul_nbits_quantizer as mnq

    config = (mnq.HQQWeightOnlyQuantConfig(block_size=128) if algorithm == "hqq" else
              mnq.DefaultWeightOnlyQuantConfig(block_size=128, is_symmetric=algorithm == "rtn sym", accuracy_level=0))
    quantizer = mnq.MatMulNBitsQuantizer(model, algo_config=config, accuracy_level=0)
    logging.getLogger().setLevel(logging.WARNING)  # the quantizer's module sets the root logger to INFO
    quantizer.process()
    return quantizer.model.model


def at_level(path: Path, level: int) -> Path:
    """A copy of a MatMulNBits bundle at another accuracy level (same weights)."""
    out = path.parent / f"level{level}"
    shutil.copytree(path, out)
    model = onnx.load(out / "llm.onnx", load_external_data=False)
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = level
    onnx.save(model, out / "llm.onnx")
    return out


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Decode:
    """One loaded bundle, its KV cache after the digits prompt with a held-out digit, and one decode step."""

    def __init__(self, path: Path, threads: int):
        self.pipe = load(path, threads=threads, spin=False)
        image = digits.samples("heldout", 1)[0][0]
        ids = np.array([self.pipe.prompt_ids(digits.PROMPT)], np.int64)
        embeds = self.pipe.embed(ids, self.pipe.image_features(self.pipe.pixel_values(image)))
        self.logits, self.cache = self.pipe.step(embeds, self.pipe.empty_cache())
        self.token = self.pipe.embed(np.array([[int(np.argmax(self.logits[0, -1]))]], np.int64))

    def step(self) -> None:
        self.pipe.step(self.token, self.cache)


def decode_rates(paths: dict[str, Path], threads: int, rounds: int) -> dict[str, float]:
    """Decode tokens per second, every bundle timed in turn within each round (3 steps each); medians."""
    probes = {name: Decode(p, threads) for name, p in paths.items()}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, probe in probes.items():
            probe.step()
            start = time.perf_counter()
            for _ in range(3):
                probe.step()
            times[name].append((time.perf_counter() - start) / 3)
    return {name: 1 / statistics.median(t) for name, t in times.items()}


def quality_row(label: str, path: Path, report: dict, seconds: float | None, args) -> dict:
    pipe = load(path, threads=args.threads, spin=False)
    if report:
        print(f"  {label}: search error below RTN's in {report['groups_below_rtn']} of {len(report['groups'])} groups "
              f"(search alone: {sum(g['scaled_rel_mse'] <= g['rtn_rel_mse'] for g in report['groups'])}); mean "
              f"relative output MSE RTN {report['rtn_rel_mse_mean']} -> {report['final_rel_mse_mean']}; "
              f"{report['bits_per_weight']} bits per weight", flush=True)
    return {"label": label, "ppl": run_suite(pipe, "perplexity", args.windows)["metrics"]["perplexity"],
            "digits": run_suite(pipe, "digits", args.digits)["metrics"]["accuracy_pct"],
            "linear_bytes": report.get("weight_bytes_int4"), "fp32_linear_bytes": report.get("weight_bytes_fp32"),
            "bundle_bytes": folder_bytes(path), "seconds": seconds}


def print_quality(rows: list[dict], args) -> None:
    fp32 = rows[0]
    print(f"\ndino-smollm quality: perplexity over {args.windows} x 512 tokens, digits accuracy over {args.digits} "
          "held-out images; MatMulNBits accuracy level 0 unless noted")
    print("| config | perplexity | ppl increase % | digits acc % | quantized linears MiB (x fp16, x fp32) | "
          "bundle MiB (x fp32) | quantization s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        linears = "-"
        if r["linear_bytes"]:
            ratio = r["fp32_linear_bytes"] / r["linear_bytes"]
            linears = f"{r['linear_bytes'] / 2**20:.1f} ({ratio / 2:.2f}x, {ratio:.2f}x)"
        seconds = "-" if r["seconds"] is None else f"{r['seconds']:.0f}"
        print(f"| {r['label']} | {r['ppl']:.3f} | {100 * (r['ppl'] / fp32['ppl'] - 1):+.1f} | {r['digits']:.1f} | "
              f"{linears} | {r['bundle_bytes'] / 2**20:.1f} ({fp32['bundle_bytes'] / r['bundle_bytes']:.2f}x) | "
              f"{seconds} |", flush=True)


def print_speed(model: str, rates: dict[str, float], paths: dict[str, Path]) -> None:
    for name, rate in rates.items():
        print(f"{model} decode, {name}: {rate:.1f} tokens/s ({rate / rates['fp32']:.2f}x fp32), "
              f"bundle {folder_bytes(paths[name]) / 2**20:.0f} MiB", flush=True)


def dino(args, work: Path) -> None:
    model = Model({"source": "zoo", "name": "dino-smollm"}, work)
    rows, paths = [], {}
    for label, how in DINO.items():
        paths[label], report, seconds = model.bundle(label, how)
        rows.append(quality_row(label, paths[label], report, seconds if how else None, args))
        print(f"  measured {label}: ppl {rows[-1]['ppl']:.3f}, digits {rows[-1]['digits']:.1f}", flush=True)
    default = next(r for r in rows if r["label"] == DEFAULT)
    for name in (DEFAULT, "rtn asym-float g32"):
        label = f"{name}, level 4"
        paths[label] = at_level(paths[name], 4)
        row = quality_row(label, paths[label], {}, None, args)
        rows.append(row | {k: default[k] for k in ("linear_bytes", "fp32_linear_bytes")} if name == DEFAULT else row)
    print_quality(rows, args)
    speed = ("fp32", DEFAULT, f"{DEFAULT}, level 4", "rtn asym-float g32", "rtn asym-float g32, level 4")
    print_speed("dino-smollm", decode_rates({k: paths[k] for k in speed}, args.threads, args.rounds), paths)


def larger(args, work: Path) -> None:
    from mmtrt.zoo.tiny_llava import build_tiny_llava

    checkpoint = work / "checkpoint"
    torch_model, processor = build_tiny_llava(**LARGER)
    torch_model.save_pretrained(checkpoint)
    processor.save_pretrained(checkpoint)
    del torch_model
    model = Model({"source": "hf", "path": str(checkpoint)}, work)
    paths, reports = {}, {}
    for label, how in LARGER_CONFIGS.items():
        paths[label], reports[label], seconds = model.bundle(label, how)
        reports[label]["seconds"] = seconds
    paths[f"{DEFAULT}, level 4"] = at_level(paths[DEFAULT], 4)
    print(f"\nlarger LLM ({LARGER['hidden']} hidden, {LARGER['layers']} layers, random weights: the per-group output "
          "error stands in for quality)")
    for label, r in reports.items():
        if "weight_bytes_int4" in r:
            print(f"larger {label}: mean relative output MSE {r['final_rel_mse_mean']} (RTN {r['rtn_rel_mse_mean']}); "
                  f"quantized linears {r['weight_bytes_int4'] / 2**20:.0f} MiB vs {r['weight_bytes_fp32'] / 2**20:.0f} "
                  f"MiB fp32; quantization {r['seconds']:.0f} s", flush=True)
    speed = ("fp32", DEFAULT, f"{DEFAULT}, level 4")
    print_speed("larger", decode_rates({k: paths[k] for k in speed}, args.threads, args.rounds), paths)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--windows", type=int, default=8, help="perplexity windows of 512 tokens")
    parser.add_argument("--digits", type=int, default=100, help="held-out digit images")
    parser.add_argument("--only", choices=["dino-smollm", "larger"])
    args = parser.parse_args(argv)
    print(f"threads={args.threads}, spinning off; decode medians of {args.rounds} rounds of 3 steps per bundle")
    with tempfile.TemporaryDirectory(prefix="bench-awq-") as tmp:
        if args.only in (None, "dino-smollm"):
            dino(args, Path(tmp) / "dino")
        if args.only in (None, "larger"):
            larger(args, Path(tmp) / "larger")
    return 0


if __name__ == "__main__":
    sys.exit(main())
