"""Visual token pruning: digits accuracy, kept tokens, LLM prefill and time to first token per budget and
criterion, with the ratios to the unpruned bundle, in one run of three phases that share a work folder.

`accuracy` (run it niced) lowers the model and runs the recipe's lossless passes once (`--ir-cache` keeps that IR
for a rerun), then per row runs token_prune on a copy of the vision component, writes a real bundle with the
compiler's own `stage_bundle` (files equal to the unpruned bundle's become hard links: ONNX Runtime reads them,
onnx.load refuses them, so they are the benchmark's own) and scores the digits suite in-process; each row is
appended to WORK/accuracy.jsonl as it finishes, and a rerun skips the rows already there. `timing` (spinning
off) times every scored row not yet in WORK/timing.jsonl against the unpruned bundle, A B A B over a few
held-out images, holding `--lock` for one row at a time. `table` prints docs/results/token-pruning.md's table and
the aims from both logs; `all` runs the three in turn. Rows run in priority order: unpruned, the `--keeps` for every criterion, then
the `--masses` (budget: dynamic, min --min, max --max) in the order given. Dynamic rows give image tokens as the
mean (min-max) kept over the digits suite.
"""

from __future__ import annotations

import argparse
import fcntl
import filecmp
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402

from mmtrt.eval import digits  # noqa: E402
from mmtrt.eval.suites import kept_tokens  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
from benchlib import cached_lossless_ir, side_by_side, write_bundle  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "dino-smollm.yaml"
STAGES = ("prefill", "first_token")
METHODS = {
    "cls_attention": {"method": "cls_attention"},
    "attention_entropy": {"method": "attention_entropy"},
    "saliency": {"method": "saliency"},
    "norm": {"method": "norm"},
    "random": {"method": "random"},
    "cls_attention+merge": {"method": "cls_attention", "merge": "contextual"},
}


def rows(args) -> list[tuple[str, str, dict | None]]:
    """(config, budget label, token_prune entry) in the order they run."""
    budgets = [(str(k), {"keep": k}) for k in args.keeps] + [
        (f"mass {m}", {"budget": "dynamic", "mass": m, "min": args.min, "max": args.max}) for m in args.masses]
    return [("unpruned", "1.0", None)] + [(name, label, {"token_prune": {**METHODS[name], **budget}})
                                          for label, budget in budgets for name in args.methods]


def folder_of(work: Path, name: str, keep: str) -> Path:
    return work / f"{name}-{keep}".replace(" ", "-")


def read_log(path: Path) -> dict[tuple[str, str], dict]:
    if not path.exists():
        return {}
    return {(r["config"], r["keep"]): r for r in map(json.loads, path.read_text().splitlines())}


def append(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def link_unchanged(bundle: Path, base: Path) -> None:
    """Replace files equal to the unpruned bundle's by hard links to them, so rows cost only their vision files."""
    for path in bundle.rglob("*"):
        twin = base / path.relative_to(bundle)
        if path.is_file() and twin.is_file() and filecmp.cmp(path, twin, shallow=False):
            path.unlink()
            os.link(twin, path)


class Answers:
    """The digits suite's answers, remembered by what the LLM is fed (its artifacts and the image tokens): two rows
    that hand the LLM bit-identical tokens for an image (a dynamic row whose count hits `max`, which keeps what
    fixed keep `max` keeps) share one generation instead of repeating it. Kept in WORK/answers.jsonl."""

    def __init__(self, path: Path):
        self.path = path
        self.known = {} if not path.exists() else dict(map(json.loads, path.read_text().splitlines()))
        self.reused = 0

    def digits(self, pipe, limit: int) -> dict:
        """The digits suite as `mmtrt eval` runs it (same images, prompt, max_new_tokens, parsing), on `pipe`."""
        llm = hashlib.sha256(json.dumps({k: v for k, v in pipe.manifest["artifacts"].items()
                                         if "vision" not in k}, sort_keys=True).encode()).hexdigest()
        features, run = {}, pipe.image_features

        def once(pixels, size=None, between=None):  # the encoder runs once per image: for the key, then in generate
            digest = hashlib.sha256(pixels.tobytes()).hexdigest()
            if digest not in features:
                features[digest] = run(pixels, size, between)
            return features[digest]

        pipe.image_features = once
        data, correct, counts = digits.samples("heldout", limit, page=pipe.image_side), 0, []
        for image, label in data:
            tokens = pipe.image_features(pipe.pixel_values(image))
            key = hashlib.sha256(f"{llm} {tokens.shape} {tokens.dtype}".encode() + tokens.tobytes()).hexdigest()
            if key in self.known:
                self.reused += 1
            else:
                self.known[key] = pipe.generate(image, digits.PROMPT, max_new_tokens=4).text
                with self.path.open("a") as f:
                    f.write(json.dumps([key, self.known[key]]) + "\n")
            correct += digits.parse_answer(self.known[key]) == label
            counts.append(tokens.shape[1])
            features.clear()
        metrics = {"accuracy_pct": round(100 * correct / len(data), 2)}
        if not pipe.dynamic_tokens:
            return metrics
        return {**metrics, **kept_tokens(counts), "kept_tokens_median": float(np.median(counts)),
                "images_at_max": counts.count(pipe.model["vision"]["image_tokens"])}


def accuracy(args) -> None:
    log, answers = args.work / "accuracy.jsonl", Answers(args.work / "answers.jsonl")
    done = read_log(log)
    lowered = []  # the model is lowered once, when a row first needs a bundle
    base = folder_of(args.work, "unpruned", "1.0") / "bundle"
    for name, keep, entry in rows(args):
        if (name, keep) in done:
            continue
        start = time.perf_counter()
        folder = folder_of(args.work, name, keep)
        if not (folder / "bundle" / "manifest.json").exists():
            lowered = lowered or [cached_lossless_ir(args.recipe, args.ir_cache)]
            shutil.rmtree(folder, ignore_errors=True)  # what a stopped run left half-written
            bundle = write_bundle(args.recipe, *lowered[0], entry, folder, ("vision",))[0]
            if entry is not None:
                link_unchanged(bundle, base)
        pipe = load(folder / "bundle", threads=args.threads, spin=False)
        reused = answers.reused
        metrics = answers.digits(pipe, args.limit)
        record = {"config": name, "keep": keep, "bundle": str(folder / "bundle"), "limit": args.limit,
                  "image_tokens": pipe.model["vision"]["image_tokens"], **metrics,
                  "answers_reused": answers.reused - reused, "seconds": round(time.perf_counter() - start, 1)}
        append(log, record)
        print(f"accuracy {json.dumps(record)}", file=sys.stderr, flush=True)
        del pipe


class Probe:
    """One loaded bundle and a few requests: the digits prompt with each of the first held-out digits."""

    def __init__(self, path: Path, threads: int, images: int):
        self.pipe = load(path, threads=threads, spin=False)
        self.images = [img for img, _ in digits.samples("heldout", images, page=self.pipe.image_side)]
        self.embeds = []
        for image in self.images:
            features = self.pipe.image_features(self.pipe.pixel_values(image))
            ids = self.pipe.fit_image_tokens(self.pipe.prompt_ids(digits.PROMPT), features.shape[1])
            self.embeds.append(self.pipe.embed(np.array([ids], np.int64), features))
        self.seq = float(np.mean([e.shape[1] for e in self.embeds]))
        self.kv_bytes = float(np.mean([sum(v.nbytes for v in self.pipe.step(e, self.pipe.empty_cache())[1].values())
                                       for e in self.embeds]))

    def prefill(self):
        for embeds in self.embeds:
            self.pipe.step(embeds, self.pipe.empty_cache())

    def first_token(self):
        for image in self.images:
            self.pipe.generate(image, digits.PROMPT, max_new_tokens=1)


class Locked:
    """The shared benchmark lock (flock(1)'s), held for one row's timing."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.file = self.path.open("a")
        fcntl.flock(self.file, fcntl.LOCK_EX)

    def __exit__(self, *_):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def timing(args) -> None:
    log, scored = args.work / "timing.jsonl", read_log(args.work / "accuracy.jsonl")
    done = read_log(log)
    if ("unpruned", "1.0") not in scored:
        raise SystemExit("timing: no unpruned row in accuracy.jsonl yet; run the accuracy phase first")
    base = Probe(Path(scored["unpruned", "1.0"]["bundle"]), args.threads, args.images)
    for key, record in scored.items():
        if key in done:
            continue
        probe = base if key == ("unpruned", "1.0") else Probe(Path(record["bundle"]), args.threads, args.images)
        with Locked(args.lock):
            times = side_by_side(base, probe, STAGES, args.rounds, repeats=1)
        (pa, pb), (ta, tb) = (np.array(times[s]) / args.images for s in STAGES)
        out = {"config": key[0], "keep": key[1], "seq": probe.seq, "prefill": pb, "prefill_x": pb / pa, "ttft": tb,
               "ttft_x": tb / ta, "kv": probe.kv_bytes, "kv_x": probe.kv_bytes / base.kv_bytes, "rounds": args.rounds, "images": args.images, "threads": args.threads,
               "load": os.getloadavg()[0]}
        append(log, out)
        print(f"timing {json.dumps(out)}", file=sys.stderr, flush=True)


def table(args) -> None:
    scored, timed = read_log(args.work / "accuracy.jsonl"), read_log(args.work / "timing.jsonl")
    base = scored[("unpruned", "1.0")]["accuracy_pct"]
    print("| config | budget | image tokens, mean (min-max) | prompt tokens | digits acc % | vs unpruned (points) | "
          "prefill ms | prefill x | TTFT ms | TTFT x | KV KiB | KV x |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, keep, _ in rows(args):
        if (name, keep) not in scored:
            print(f"| {name} | {keep} | not run | | | | | | | | | |")
            continue
        r, t = scored[name, keep], timed.get((name, keep))
        tokens = (f"{r['kept_tokens_mean']:.1f} ({r['kept_tokens_min']}-{r['kept_tokens_max']})"
                  if "kept_tokens_mean" in r else str(r["image_tokens"]))
        times = (f"{t['seq']:.0f} | {r['accuracy_pct']:.1f} | {r['accuracy_pct'] - base:+.1f} | {t['prefill']:.1f} | "
                 f"{t['prefill_x']:.2f} | {t['ttft']:.1f} | {t['ttft_x']:.2f} | {t['kv'] / 1024:.0f} | {t['kv_x']:.2f}"
                 if t else f"| {r['accuracy_pct']:.1f} | {r['accuracy_pct'] - base:+.1f} | not timed | | | | |")
        print(f"| {name} | {keep} | {tokens} | {times} |")
    aims(scored, base)


def mean_tokens(r: dict) -> float:
    return r.get("kept_tokens_mean", r["image_tokens"])


def aims(scored: dict, base: float) -> None:
    for (name, keep), r in scored.items():
        if name not in ("random", "unpruned") and ("random", keep) in scored:
            ours, rnd = r["accuracy_pct"], scored["random", keep]["accuracy_pct"]
            print(f"aim {name} beats random at {keep}: {ours:.1f} vs {rnd:.1f} -> {'yes' if ours > rnd else 'NO'}")
        if keep == "mass 0.9" and (name, "0.5") in scored:
            half, drop = scored[name, "0.5"], base - r["accuracy_pct"]
            verdict = "yes" if mean_tokens(r) < mean_tokens(half) and drop <= 2 else "NO"
            print(f"aim {name} mass 0.9 keeps fewer than keep 0.5 ({mean_tokens(r)} vs {mean_tokens(half)}) and "
                  f"drops <= 2 points ({drop:.1f}) -> {verdict}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", nargs="?", default="all", choices=("accuracy", "timing", "table", "all"))
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="a recipe with lossless passes only")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-token-prune"),
                        help="bundles and the row logs; reruns resume from it")
    parser.add_argument("--ir-cache", type=Path, help="a pickle of the lowered IR: read if present, else written")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=100, help="held-out digit images for accuracy")
    parser.add_argument("--images", type=int, default=1, help="held-out digit images per timed round")
    parser.add_argument("--rounds", type=int, default=7, help="alternating timing rounds")
    parser.add_argument("--lock", type=Path, default=Path("/work/bench.lock"), help="held while a row is timed")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--keeps", nargs="*", type=float, default=[0.5, 0.25, 0.125])
    parser.add_argument("--masses", nargs="*", type=float, default=[],
                        help="budget: dynamic rows at these masses, run after the keeps in the order given")
    parser.add_argument("--min", type=int, default=16, help="budget: dynamic: the fewest tokens kept")
    parser.add_argument("--max", type=int, default=128, help="budget: dynamic: the most tokens kept")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    for name, phase in (("accuracy", accuracy), ("timing", timing), ("table", table)):
        if args.phase in (name, "all"):
            phase(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
