"""Visual token pruning on zoo:dino-smollm: digits accuracy, LLM prefill, time to first token and KV cache bytes
per budget and criterion, with the ratios to keep 1.0, measured in one run.

The model is lowered and the lossless passes of recipes/dino-smollm.yaml run once; each configuration then runs
token_prune on a copy of the vision component and is written as a real bundle by the compiler's own
`stage_bundle`. Times alternate each configuration with the keep-1.0 bundle (A B A B) and report medians; both
use the same thread count with spinning off (OMP_WAIT_POLICY=PASSIVE; ONNX Runtime allow_spinning=0). The timed
request is the digits prompt with one held-out digit image; accuracy is over the first --limit held-out digits.
`--masses` adds `budget: dynamic` rows (min --min, max --max) per criterion: their image tokens are the mean
(min-max) kept over the digits suite, their prompt tokens those of the timed request.
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
from mmtrt.runtime import load  # noqa: E402
from benchlib import lossless_ir, side_by_side, write_bundle  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "dino-smollm.yaml"
KEEPS = (0.5, 0.25, 0.125)
STAGES = ("prefill", "first_token")
METHODS = {
    "cls_attention": {"method": "cls_attention"},
    "norm": {"method": "norm"},
    "random": {"method": "random"},
    "attention_entropy": {"method": "attention_entropy"},
    "saliency": {"method": "saliency"},
    "cls_attention+merge": {"method": "cls_attention", "merge": "contextual"},
}


class Probe:
    """One loaded bundle and one request: the digits prompt with a held-out digit."""

    def __init__(self, path: Path, threads: int):
        self.pipe = load(path, threads=threads, spin=False)
        self.image = digits.samples("heldout", 1, page=self.pipe.image_side)[0][0]
        features = self.pipe.image_features(self.pipe.pixel_values(self.image))
        self.ids = np.array([self.pipe.fit_image_tokens(self.pipe.prompt_ids(digits.PROMPT), features.shape[1])],
                            np.int64)
        self.embeds = self.pipe.embed(self.ids, features)
        _, cache = self.pipe.step(self.embeds, self.pipe.empty_cache())
        self.kv_bytes = sum(v.nbytes for v in cache.values())

    def prefill(self):
        self.pipe.step(self.embeds, self.pipe.empty_cache())

    def first_token(self):
        self.pipe.generate(self.image, digits.PROMPT, max_new_tokens=1)


def row(name: str, keep, probe: Probe, metrics: dict, times: dict, base_acc: float, base_kv: int) -> dict:
    (pa, pb), (ta, tb) = times["prefill"], times["first_token"]
    accuracy, tokens = metrics["accuracy_pct"], probe.pipe.model["vision"]["image_tokens"]
    if "kept_tokens_mean" in metrics:
        tokens = f"{metrics['kept_tokens_mean']:.1f} ({metrics['kept_tokens_min']}-{metrics['kept_tokens_max']})"
    return {"config": name, "keep": keep, "tokens": tokens, "mean_tokens": metrics.get("kept_tokens_mean", tokens),
            "seq": probe.ids.shape[1], "acc": accuracy, "drop": base_acc - accuracy,
            "prefill": pb, "prefill_x": pb / pa,
            "ttft": tb, "ttft_x": tb / ta, "kv": probe.kv_bytes, "kv_x": probe.kv_bytes / base_kv}


def print_table(rows: list[dict], limit: int) -> None:
    print(f"| config | keep | image tokens | prompt tokens | digits acc % (n={limit}) | drop (points) | prefill ms | "
          "prefill x | TTFT ms | TTFT x | KV KiB | KV x |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(table_row(r))


def table_row(r: dict) -> str:
    return (f"| {r['config']} | {r['keep']} | {r['tokens']} | {r['seq']} | {r['acc']:.1f} | {r['drop']:.1f} | "
            f"{r['prefill']:.1f} | {r['prefill_x']:.2f} | {r['ttft']:.1f} | {r['ttft_x']:.2f} | "
            f"{r['kv'] / 1024:.0f} | {r['kv_x']:.2f} |")


def print_aims(rows: list[dict]) -> None:
    by = {(r["config"], r["keep"]): r for r in rows}
    quarter = [r["prefill_x"] for r in rows if r["keep"] == 0.25]
    print(f"aim prefill at keep 0.25 <= 0.4x: {', '.join(f'{x:.2f}x' for x in quarter)}")
    for name, keep in by:
        if name not in ("random", "unpruned") and ("random", keep) in by:
            ours, rnd = by[name, keep]["acc"], by["random", keep]["acc"]
            print(f"aim {name} beats random at {keep}: {ours:.1f} vs {rnd:.1f} -> {'yes' if ours > rnd else 'NO'}")
    for name, keep in by:
        if keep == "mass 0.9" and (name, 0.5) in by:
            dyn, half = by[name, keep], by[name, 0.5]
            verdict = "yes" if dyn["mean_tokens"] < half["mean_tokens"] and dyn["drop"] <= 2 else "NO"
            print(f"aim {name} mass 0.9 keeps fewer than keep 0.5 ({dyn['mean_tokens']} vs {half['mean_tokens']}) "
                  f"and drops <= 2 points ({dyn['drop']:.1f}) -> {verdict}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="a recipe with lossless passes only")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7, help="alternating timing rounds (each a median of 3)")
    parser.add_argument("--limit", type=int, default=100, help="held-out digit images for accuracy")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--keeps", nargs="*", type=float, default=list(KEEPS))
    parser.add_argument("--masses", nargs="*", type=float, default=[], help="budget: dynamic rows at these masses")
    parser.add_argument("--min", type=int, default=16, help="budget: dynamic: the fewest tokens kept")
    parser.add_argument("--max", type=int, default=128, help="budget: dynamic: the most tokens kept")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-token-prune-") as tmp:
        tmp = Path(tmp)
        base_ir, reports = lossless_ir(args.recipe)
        base = Probe(write_bundle(args.recipe, base_ir, reports, None, tmp / "keep-1.0", ("vision",))[0],
                     args.threads)
        base_metrics = run_suite(base.pipe, "digits", args.limit)["metrics"]
        base_acc = base_metrics["accuracy_pct"]
        base_times = side_by_side(base, base, STAGES, args.rounds)
        rows = [row("unpruned", 1.0, base, base_metrics, base_times, base_acc, base.kv_bytes)]
        budgets = [(keep, {"keep": keep}) for keep in args.keeps] + [
            (f"mass {m}", {"budget": "dynamic", "mass": m, "min": args.min, "max": args.max}) for m in args.masses]
        for keep, budget in budgets:
            for name in args.methods:
                folder = tmp / f"{name}-{keep}".replace(" ", "-")
                entry = {"token_prune": {**METHODS[name], **budget}}
                bundle = write_bundle(args.recipe, base_ir, reports, entry, folder, ("vision",))[0]
                probe = Probe(bundle, args.threads)
                metrics = run_suite(probe.pipe, "digits", args.limit)["metrics"]
                rows.append(row(name, keep, probe, metrics, side_by_side(base, probe, STAGES, args.rounds), base_acc,
                                base.kv_bytes))
                print(f"[{time.perf_counter() - started:.0f} s] {table_row(rows[-1])}", file=sys.stderr, flush=True)
                del probe
                shutil.rmtree(folder)
    print(f"{args.recipe.name}, {args.threads} threads, spinning off, ONNX Runtime CPU; times are medians of "
          f"{args.rounds} alternating rounds (3 calls each) against keep 1.0; digits on {args.limit} held-out images; "
          f"KV = fp32 cache after the prefill of the timed request; the unpruned row is keep 1.0 against itself (the "
          f"noise floor); {time.perf_counter() - started:.0f} s in all")
    print_table(rows, args.limit)
    print_aims(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
