"""Visual token pruning on zoo:dino-smollm: digits accuracy, LLM prefill, time to first token and KV cache bytes
per budget and criterion, with the ratios to keep 1.0, measured in one run.

The model is lowered and the lossless passes of recipes/dino-smollm.yaml run once; each configuration then runs
token_prune on a copy of the vision component and is written as a real bundle by the compiler's own
`stage_bundle`. Times alternate each configuration with the keep-1.0 bundle (A B A B) and report medians; both
use the same thread count with spinning off (OMP_WAIT_POLICY=PASSIVE; ONNX Runtime allow_spinning=0). The timed
request is the digits prompt with one held-out digit image; accuracy is over the first --limit held-out digits.
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
    "cls_attention+merge": {"method": "cls_attention", "merge": "contextual"},
}


class Probe:
    """One loaded bundle and one request: the digits prompt with a held-out digit."""

    def __init__(self, path: Path, threads: int):
        self.pipe = load(path, threads=threads, spin=False)
        self.image = digits.samples("heldout", 1, page=self.pipe.image_side)[0][0]
        self.ids = np.array([self.pipe.prompt_ids(digits.PROMPT)], np.int64)
        self.embeds = self.pipe.embed(self.ids, self.pipe.image_features(self.pipe.pixel_values(self.image)))
        _, cache = self.pipe.step(self.embeds, self.pipe.empty_cache())
        self.kv_bytes = sum(v.nbytes for v in cache.values())

    def prefill(self):
        self.pipe.step(self.embeds, self.pipe.empty_cache())

    def first_token(self):
        self.pipe.generate(self.image, digits.PROMPT, max_new_tokens=1)


def row(name: str, keep: float, probe: Probe, accuracy: float, times: dict, base_acc: float, base_kv: int) -> dict:
    (pa, pb), (ta, tb) = times["prefill"], times["first_token"]
    return {"config": name, "keep": keep, "tokens": probe.pipe.model["vision"]["image_tokens"],
            "seq": probe.ids.shape[1], "acc": accuracy, "drop": base_acc - accuracy,
            "prefill": pb, "prefill_x": pb / pa,
            "ttft": tb, "ttft_x": tb / ta, "kv": probe.kv_bytes, "kv_x": probe.kv_bytes / base_kv}


def print_table(rows: list[dict], limit: int) -> None:
    print(f"| config | keep | image tokens | prompt tokens | digits acc % (n={limit}) | drop (points) | prefill ms | "
          "prefill x | TTFT ms | TTFT x | KV KiB | KV x |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['config']} | {r['keep']} | {r['tokens']} | {r['seq']} | {r['acc']:.1f} | {r['drop']:.1f} | "
              f"{r['prefill']:.1f} | {r['prefill_x']:.2f} | {r['ttft']:.1f} | {r['ttft_x']:.2f} | "
              f"{r['kv'] / 1024:.0f} | {r['kv_x']:.2f} |")


def print_aims(rows: list[dict]) -> None:
    by = {(r["config"], r["keep"]): r for r in rows}
    quarter = [r["prefill_x"] for r in rows if r["keep"] == 0.25]
    print(f"aim prefill at keep 0.25 <= 0.4x: {', '.join(f'{x:.2f}x' for x in quarter)}")
    for keep in KEEPS:
        if ("cls_attention", keep) in by and ("random", keep) in by:
            cls, rnd = by["cls_attention", keep]["acc"], by["random", keep]["acc"]
            verdict = "yes" if cls > rnd else "NO"
            print(f"aim cls_attention beats random at keep {keep}: {cls:.1f} vs {rnd:.1f} -> {verdict}")
    if ("cls_attention", 0.5) in by:
        drop = by["cls_attention", 0.5]["drop"]
        print(f"aim drop at keep 0.5 <= 2 points (cls_attention): {drop:.1f} -> {'yes' if drop <= 2 else 'NO'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="a recipe with lossless passes only")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7, help="alternating timing rounds (each a median of 3)")
    parser.add_argument("--limit", type=int, default=100, help="held-out digit images for accuracy")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--keeps", nargs="+", type=float, default=list(KEEPS))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-token-prune-") as tmp:
        tmp = Path(tmp)
        base_ir, reports = lossless_ir(args.recipe)
        base = Probe(write_bundle(args.recipe, base_ir, reports, None, tmp / "keep-1.0", ("vision",))[0],
                     args.threads)
        base_acc = run_suite(base.pipe, "digits", args.limit)["metrics"]["accuracy_pct"]
        base_times = side_by_side(base, base, STAGES, args.rounds)
        rows = [row("unpruned", 1.0, base, base_acc, base_times, base_acc, base.kv_bytes)]
        for keep in args.keeps:
            for name in args.methods:
                folder = tmp / f"{name}-{keep}"
                entry = {"token_prune": {**METHODS[name], "keep": keep}}
                bundle = write_bundle(args.recipe, base_ir, reports, entry, folder, ("vision",))[0]
                probe = Probe(bundle, args.threads)
                accuracy = run_suite(probe.pipe, "digits", args.limit)["metrics"]["accuracy_pct"]
                rows.append(row(name, keep, probe, accuracy, side_by_side(base, probe, STAGES, args.rounds), base_acc,
                                base.kv_bytes))
                print(f"[{time.perf_counter() - started:.0f} s] {name} keep {keep}: {rows[-1]['acc']:.1f} %",
                      file=sys.stderr, flush=True)
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
