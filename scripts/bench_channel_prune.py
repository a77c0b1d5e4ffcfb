"""Structured channel pruning on zoo:dino-smollm: parameters, FLOPs, vision / prefill / decode latency on ONNX
Runtime, digits accuracy and perplexity per configuration, with the ratios to the unpruned bundle, in one run.

The model is lowered and the lossless passes of recipes/dino-smollm.yaml run once; each configuration runs
channel_prune on a copy and is written as a real bundle by the compiler's own `stage_bundle`. Latencies alternate
each configuration with the unpruned bundle within every round (A B A B) and report medians; both use the same
thread count with spinning off (OMP_WAIT_POLICY=PASSIVE; ONNX Runtime allow_spinning=0). Vision: one held-out
digit; prefill: the digits prompt with that digit's features; decode: one token after that prefill. No
retraining: the accuracy columns are what pruning costs as is.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402

from mmtrt.eval import digits  # noqa: E402
from mmtrt.eval.suites import run_suite  # noqa: E402
from mmtrt.ir.flops import count_flops  # noqa: E402
from mmtrt.ir.graph import ModelIR  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
from benchlib import lossless_ir, side_by_side, write_bundle  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "dino-smollm.yaml"
ORT_ONLY = {"preprocess": ["torchvision"], "vision": ["onnxruntime"], "embed": ["onnxruntime"], "llm": ["onnxruntime"]}
CHANGED = ("vision", "llm")  # the components channel_prune may rewrite, copied per configuration
STAGES = ("vision", "prefill", "decode")
PREFILL_TOKENS = 100  # the digits prompt with 64 image tokens
CONFIGS = {
    "vision mlp 0.3, l2": {"vision": {"mlp": 0.3}},
    "vision mlp 0.3, l2, no compensation": {"vision": {"mlp": 0.3}, "bias_compensation": False},
    "vision mlp 0.3, activation": {"vision": {"mlp": 0.3}, "importance": "activation"},
    "vision mlp 0.5, activation": {"vision": {"mlp": 0.5}, "importance": "activation"},
    "vision heads 2 of 6, activation": {"vision": {"heads": 0.34}, "importance": "activation"},
    "llm mlp 0.2, l2": {"llm": {"mlp": 0.2}},
    "llm mlp 0.2, activation": {"llm": {"mlp": 0.2}, "importance": "activation"},
    "llm mlp 0.2, activation, no compensation": {"llm": {"mlp": 0.2}, "importance": "activation",
                                                 "bias_compensation": False},
    "llm kv groups 1 of 3, activation": {"llm": {"heads": 0.34}, "importance": "activation"},
}


def size(ir: ModelIR) -> dict[str, float]:
    """Float parameters of vision + LLM; FLOPs of one image and of a prefill of the digits prompt."""
    params = sum(int(np.prod(t.dims)) for n in ("vision", "llm") for t in ir.components[n].onnx.graph.initializer
                 if t.data_type == 1)
    llm_dims = {"batch": 1, "seq": PREFILL_TOKENS, "past": 0, "total": PREFILL_TOKENS}
    return {"params": params, "vision_flops": count_flops(ir.components["vision"].onnx, {"num_images": 1}),
            "llm_flops": count_flops(ir.components["llm"].onnx, llm_dims)}


class Probe:
    """One loaded bundle and one request: the digits prompt with a held-out digit."""

    def __init__(self, path: Path, threads: int):
        self.pipe = load(path, threads=threads, spin=False)
        self.pixels = self.pipe.pixel_values(digits.samples("heldout", 1, page=self.pipe.image_side)[0][0])
        ids = np.array([self.pipe.prompt_ids(digits.PROMPT)], np.int64)
        self.embeds = self.pipe.embed(ids, self.pipe.image_features(self.pixels))
        _, self.cache = self.pipe.step(self.embeds, self.pipe.empty_cache())

    def vision(self):
        self.pipe.image_features(self.pixels)

    def prefill(self):
        self.pipe.step(self.embeds, self.pipe.empty_cache())

    def decode(self):
        self.pipe.step(self.embeds[:, -1:], self.cache)


def quality(pipe, args) -> dict[str, float]:
    return {"digits": run_suite(pipe, "digits", args.digits)["metrics"]["accuracy_pct"],
            "ppl": run_suite(pipe, "perplexity", args.windows)["metrics"]["perplexity"]}


def print_table(rows: list[dict], base: dict, args) -> None:
    print(f"| config | params M (x) | vision GFLOPs (x) | LLM GFLOPs (x) | vision ms (x) | prefill ms (x) | "
          f"decode ms (x) | digits % (n={args.digits}) | perplexity (x) | prune s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        cells = [f"{r['params'] / 1e6:.1f} ({r['params'] / base['params']:.2f})",
                 f"{r['vision_flops'] / 1e9:.2f} ({r['vision_flops'] / base['vision_flops']:.2f})",
                 f"{r['llm_flops'] / 1e9:.1f} ({r['llm_flops'] / base['llm_flops']:.2f})"]
        cells += [f"{r['times'][s][1]:.1f} ({r['times'][s][1] / r['times'][s][0]:.2f})"
                  for s in ("vision", "prefill", "decode")]
        cells += [f"{r['digits']:.1f}", f"{r['ppl']:.2f} ({r['ppl'] / base['ppl']:.2f})",
                  "-" if r["seconds"] is None else f"{r['seconds']:.0f}"]
        print(f"| {r['config']} | " + " | ".join(cells) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9, help="alternating timing rounds (each a median of 3)")
    parser.add_argument("--digits", type=int, default=100, help="held-out digit images for accuracy")
    parser.add_argument("--windows", type=int, default=8, help="perplexity windows of 512 tokens")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-channel-prune-") as tmp:
        tmp = Path(tmp)
        base_ir, reports = lossless_ir(RECIPE)
        path, _, _ = write_bundle(RECIPE, base_ir, reports, None, tmp / "unpruned", CHANGED, ORT_ONLY)
        base_probe = Probe(path, args.threads)
        base = {"config": "unpruned", **size(base_ir), **quality(base_probe.pipe, args), "seconds": None,
                "times": side_by_side(base_probe, base_probe, STAGES, args.rounds)}
        rows = [base]
        for name in args.configs:
            path, ir, seconds = write_bundle(RECIPE, base_ir, reports, {"channel_prune": CONFIGS[name]},
                                             tmp / name.replace(" ", "_"), CHANGED, ORT_ONLY)
            probe = Probe(path, args.threads)
            rows.append({"config": name, **size(ir), **quality(probe.pipe, args), "seconds": seconds,
                         "times": side_by_side(base_probe, probe, STAGES, args.rounds)})
            print(f"[{time.perf_counter() - started:.0f} s] {name}: digits {rows[-1]['digits']:.1f} %, "
                  f"ppl {rows[-1]['ppl']:.2f}", file=sys.stderr, flush=True)
            del probe, ir
            shutil.rmtree(path.parent)
    print(f"zoo:dino-smollm, {args.threads} threads, spinning off, ONNX Runtime CPU; latencies are medians of "
          f"{args.rounds} rounds (3 calls each) alternating with the unpruned bundle, x = ratio to it in the same "
          f"rounds (the unpruned row is against itself: the noise floor); digits on {args.digits} held-out images, "
          f"perplexity on {args.windows} x 512 tokens; LLM FLOPs at a {PREFILL_TOKENS}-token prefill; "
          f"{time.perf_counter() - started:.0f} s in all")
    print_table(rows, base, args)
    vision = [r for r in rows if r["config"].startswith("vision mlp 0.3")]
    for r in vision:
        x = r["times"]["vision"][1] / r["times"]["vision"][0]
        print(f"aim vision latency at 30 % of vision MLP channels <= 0.85x ({r['config']}): {x:.2f}x -> "
              f"{'yes' if x <= 0.85 else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
