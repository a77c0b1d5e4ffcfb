"""Speculative decoding against plain decoding on one bundle, side by side in one run.

For each draft (prompt lookup; the bundle's early-exit draft when it has one, and those of `--drafts`, bundles of
the same model compiled with other early-exit drafts) and each k, per task: acceptance rate, tokens per full
forward, decode tokens/s and time per answer, each against plain decoding measured in the same rounds
(configurations interleaved per round, medians over rounds), and whether every greedy answer equals plain
decoding's token for token. Prompts put a passage after the image (text written for this benchmark, in no
calibration set) that the answer repeats (`repeat`) or continues (`continue`: new text, which only the model's own
repetitions let prompt lookup draft).

    PYTHONPATH=. python scripts/bench_speculative.py out/dino-smollm.bundle --image examples/digit-5.png \
        --drafts out/dino-smollm-k6.bundle
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from mmtrt.runtime import load
from mmtrt.runtime.batch import Request

PASSAGES = [
    "The committee met on Tuesday to review the budget for the coming year. After a long discussion about the "
    "costs of the new library, the members agreed to postpone the decision until the next meeting, when the "
    "architect would present a revised plan with a smaller reading room and a larger garden.",
    "To install the package, download the archive, unpack it into a folder of your choice, and run the setup "
    "script from a terminal. The script checks the version of the interpreter, creates a virtual environment, "
    "installs the dependencies listed in the requirements file, and prints the command that starts the server.",
    "Every morning the baker lit the oven before sunrise, weighed the flour, the water and the salt, and mixed "
    "the dough by hand. While it rested, he swept the shop, set out the baskets, and wrote the day's bread on the "
    "board beside the door, in the same order as the day before.",
]
TASKS = {"repeat": "Here is a text: {p} Repeat the text word for word.", "continue": "Continue this text: {p}"}


def prompts(task: str, chars: int | None = None) -> list[str]:
    """The task on every passage, each passage cut to its first `chars` characters (a small envelope)."""
    return [TASKS[task].format(p=p[:chars]) for p in PASSAGES]


def configurations(pipe, ks: list[int], drafts: list[str], threads: int | None) -> dict[str, dict | None]:
    configs: dict[str, dict | None] = {"plain": None}
    configs.update({f"prompt_lookup k={k}": {"draft": "prompt_lookup", "k": k, "max_ngram": 3} for k in ks})
    for bundle in [pipe.path, *map(Path, drafts)]:
        own = early_exit(pipe, bundle, threads)
        if own is not None:
            adapter = "with adapter" if own.pop("adapter") else "no adapter"
            configs.update({f"early_exit K={own['layers']} {adapter} k={k}": {**own, "k": k} for k in ks})
    return configs


def early_exit(pipe, bundle: Path, threads: int | None) -> dict | None:
    """The early-exit configuration of `bundle`'s draft, its runner added to `pipe` (the same model's LLM) under a
    name of its own; None when the bundle has no such draft."""
    from mmtrt.backends.onnxruntime_backend import OrtRunner
    from mmtrt.ir.spec import TensorSpec

    manifest = json.loads((bundle / "manifest.json").read_text())
    own = manifest["model"].get("speculative") or {}
    if own.get("draft") != "early_exit":
        return None
    name = "draft" if bundle == pipe.path else f"draft:{bundle.name}"
    if name not in pipe.runners:
        draft = manifest["components"][own["component"]]
        pipe.specs[name] = [TensorSpec.from_json(s) for s in draft["inputs"]]
        pipe.runners[name] = OrtRunner(bundle / draft["artifact"], threads, True)
    adapter = any(p["pass"] == "speculative" and "adapter" in p["changes"]["llm"] for p in manifest["passes"])
    return {**own, "component": name, "adapter": adapter}


def measure_batch(pipe, image, texts: list[str], config: dict | None, new_tokens: int) -> dict:
    """Every prompt in one batch (`generate_batch`): tokens per second of the batch's wall time. A configuration
    named `per_sequence` verifies each sequence in a call of its own, as the static and hf layouts do."""
    from mmtrt.runtime import speculative_kv

    pipe.speculative = config and {key: v for key, v in config.items() if key != "per_sequence"}
    batches = speculative_kv.BlockVerifier.batches
    speculative_kv.BlockVerifier.batches = not (config or {}).get("per_sequence")
    try:
        t0 = time.perf_counter()
        out = pipe.generate_batch([Request(image, text, new_tokens) for text in texts])
        wall_s = time.perf_counter() - t0
    finally:
        speculative_kv.BlockVerifier.batches = batches
    decoded = sum(len(g.token_ids) - 1 for g in out)
    counts = [g.speculative or {"proposed": 0, "accepted": 0} for g in out]
    return {"tokens": [g.token_ids for g in out], "decode_tok_s": decoded / wall_s, "answer_s": wall_s,
            "proposed": sum(c["proposed"] for c in counts), "accepted": sum(c["accepted"] for c in counts),
            "decoded": decoded}


def measure_each(pipe, image, texts: list[str], config: dict | None, new_tokens: int) -> dict:
    """One round of every prompt, one at a time, under one configuration."""
    pipe.speculative = config
    tokens, decode_s, wall_s, proposed, accepted = [], 0.0, 0.0, 0, 0
    for text in texts:
        t0 = time.perf_counter()
        g = pipe.generate(image, text, new_tokens)
        wall_s += time.perf_counter() - t0
        tokens.append(g.token_ids)
        decode_s += g.timings["decode_ms_per_token"] * max(len(g.token_ids) - 1, 1) / 1e3
        if g.speculative:
            proposed, accepted = proposed + g.speculative["proposed"], accepted + g.speculative["accepted"]
    decoded = sum(len(t) - 1 for t in tokens)
    return {"tokens": tokens, "decode_tok_s": decoded / decode_s, "answer_s": wall_s / len(texts),
            "proposed": proposed, "accepted": accepted, "decoded": decoded}


def run(bundle: str, image: str, ks: list[int], rounds: int, new_tokens: int, threads: int | None,
        chars: int | None, drafts: list[str], tasks: list[str], batch: bool = False) -> list[dict]:
    pipe = load(bundle, threads=threads, prefix_cache_mib=0)
    configs = configurations(pipe, ks, drafts, threads)
    if batch:
        configs.update({f"prompt_lookup k={k}, a call per sequence": {**configs[f"prompt_lookup k={k}"],
                                                                       "per_sequence": True} for k in ks})
    measure = measure_batch if batch else measure_each
    measure(pipe, image, prompts(tasks[0], chars)[:1], None, 4)  # warm-up: sessions, allocator
    results: dict[tuple[str, str], list[dict]] = {(t, name): [] for t in tasks for name in configs}
    for r in range(rounds):
        order = list(results) if r % 2 == 0 else list(reversed(results))
        for task, name in order:
            results[task, name].append(measure(pipe, image, prompts(task, chars), configs[name], new_tokens))
    rows = []
    for (task, name), runs in results.items():
        plain, first, count = results[task, "plain"], runs[0], len(PASSAGES)
        decode = statistics.median(x["decode_tok_s"] for x in runs)
        answer = statistics.median(x["answer_s"] for x in runs)
        rows.append({
            "task": task, "config": name, "answers": count, "mean_answer_tokens": first["decoded"] / count + 1,
            "acceptance": first["accepted"] / first["proposed"] if first["proposed"] else None,
            "tokens_per_forward": first["decoded"] / (first["decoded"] - first["accepted"]),
            "decode_tok_s": decode, "decode_speedup": decode / statistics.median(x["decode_tok_s"] for x in plain),
            "answer_s": answer, "answer_ratio": answer / statistics.median(x["answer_s"] for x in plain),
            "identical": all(x["tokens"] == p["tokens"] for x, p in zip(runs, plain)),
        })
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| task | configuration | answer tokens (mean) | acceptance | tokens / full forward | decode tok/s "
             "| vs plain | time / answer | vs plain | greedy output identical |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        acceptance = "-" if r["acceptance"] is None else f"{r['acceptance']:.0%}"
        lines.append(f"| {r['task']} | {r['config']} | {r['mean_answer_tokens']:.1f} | {acceptance} | "
                     f"{r['tokens_per_forward']:.2f} | {r['decode_tok_s']:.1f} | "
                     f"{r['decode_speedup']:.2f}x | {r['answer_s'] * 1e3:.0f} ms | {r['answer_ratio']:.2f}x | "
                     f"{'yes' if r['identical'] else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--image", default="examples/sample.png")
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--passage-chars", type=int, default=None, help="cut each passage (a small prompt envelope)")
    ap.add_argument("--drafts", nargs="*", default=[], help="bundles of the same model with other early-exit drafts")
    ap.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    ap.add_argument("--batch", action="store_true", help="each task's prompts in one batch (a paged bundle): tokens "
                    "per second of the batch's wall time, and verification in one call against a call per sequence")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = run(args.bundle, args.image, args.k, args.rounds, args.max_new_tokens, args.threads,
               args.passage_chars, args.drafts, args.tasks, args.batch)
    print(json.dumps(rows, indent=2) if args.json else table(rows))


if __name__ == "__main__":
    main()
