"""Time to first token, decode ms per token and tokens/s with 1 and 8 concurrent requests, on one checkpoint:
`mmtrt run` on its plain and token-pruned bundles (its batch: every image encoded, then all decoded together); vLLM
alone on the exported folder (its own preprocessing and vision tower), fp32 and bf16; and the split (mmtrt's vision
side, vLLM's LLM fed with image_embeds) in `mmtrt serve --llm vllm`'s loop, plain and token-pruned. Every request
carries an image no engine has seen (both cache encoder outputs by content). Within one vLLM dtype the three vLLM
rows share one engine and run in rounds (alone, split plain, split pruned, again): medians of interleaved runs; the
`mmtrt run` rows come first, one bundle loaded at a time. Accuracy: the token-pruned split's top-1 agreement with
the plain split's greedy answers, teacher-forced as the agreement suite measures (handoff/vllm_agreement.py).

    PYTHONPATH=. python scripts/bench_vllm.py --model smollm-llava --work DIR --out docs/results/vllm-split.md

The checkpoint is a random-weight one of a real architecture (scripts/scale_models.py), written once into
WORK/MODEL; its results go to WORK/MODEL/results.json, and --out writes the page from every model's results there.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from bench_vllm_page import DTYPES, write_page  # noqa: E402

PROMPT = "Describe the picture in detail."
NEW_TOKENS = 24
MODELS = {  # image size of every request, token_prune's options, whether the pruned bundle declares a budget, and
    # the checkpoint's dtype (bfloat16 as on the Hub: a float32 0.5B source takes 9.5 GB to compile); a variant
    # names its architecture and a vision pass both bundles add
    "smollm-llava": {"size": (224, 224), "prune": "{keep: 0.5, method: norm}", "evaluate": True, "dtype": "float32"},
    "onevision-0.5b": {"size": (500, 300), "prune": "{keep: 0.5, method: norm}", "evaluate": False,
                       "dtype": "bfloat16"},
}
MODELS["onevision-0.5b-int8-vision"] = {**MODELS["onevision-0.5b"], "architecture": "onevision-0.5b",
                                        "vision": "int8_weights: {components: [vision], activations: dynamic}"}
BUDGET = ("evaluate: {agreement: {data: agreement.jsonl, max_new_tokens: 8}}\n"
          "budgets: {agreement_top1_drop: 50}\n")


def images(rng, n, size=(224, 224)):
    from PIL import Image

    return [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(n)]


def timed(submit, flush, requests) -> dict:
    """submit(image, on_tokens) for each image at once, then flush() (an engine that runs on the caller's thread
    runs them then); TTFT (median), decode ms/token (median), tokens/s overall."""
    done: queue.SimpleQueue = queue.SimpleQueue()
    start = time.perf_counter()
    firsts, ends, counts = {}, {}, {}

    def on_tokens(i, n, final):
        now = time.perf_counter()
        if n:
            firsts.setdefault(i, now)
        counts[i] = counts.get(i, 0) + n
        if final:
            ends[i] = now
            done.put(i)

    for i, image in enumerate(requests):
        submit(image, lambda n, final, i=i: on_tokens(i, n, final))
    flush()
    for _ in requests:
        done.get(timeout=3600)
    total = max(ends.values()) - start
    return {"ttft_ms": 1e3 * statistics.median(firsts[i] - start for i in ends),
            "decode_ms": 1e3 * statistics.median((ends[i] - firsts[i]) / max(counts[i] - 1, 1) for i in ends),
            "tokens_per_s": sum(counts.values()) / total}


def batch_submitter(pipe, prompt=PROMPT, new_tokens=NEW_TOKENS):
    """`mmtrt run`'s batch: the requests of one call are encoded, then decode together."""
    from mmtrt.runtime import Request
    from mmtrt.runtime.scheduler import run_to_end

    pending = []

    def submit(image, on_tokens):
        pending.append((image, on_tokens))

    def flush():
        preps = [pipe.prepare(i, Request(img, prompt, new_tokens)) for i, (img, _) in enumerate(pending)]
        for seq, delta in run_to_end(pipe, preps):
            pending[seq.prep.index][1](len(delta.token_ids), bool(delta.finish_reason))
        pending.clear()

    return submit, flush


def serving_submitter(loop, prompt=PROMPT, new_tokens=NEW_TOKENS, prompt_tokens: set | None = None):
    """`mmtrt serve`'s loop: requests queue, and join the batch between decode steps as places free up (the
    image encoded at admission; under `--llm vllm`, handed to vLLM then, which prefills while the next one is
    encoded)."""
    from mmtrt.runtime import Request

    def submit(image, on_tokens):
        handles = []

        def on_delta(delta):
            if delta.finish_reason and prompt_tokens is not None:
                prompt_tokens.add(handles[0].generation.prompt_tokens)
            on_tokens(len(delta.token_ids), delta.finish_reason is not None)

        handles.append(loop.submit(Request(image, prompt, new_tokens), on_delta=on_delta))

    return submit, lambda: None


def vllm_alone_submitter(engine, ids, eos_token_ids, new_tokens=NEW_TOKENS, prompt_tokens: set | None = None):
    """vLLM's own preprocessing and vision tower: the raw image and the prompt `ids` with one image placeholder;
    `prompt_tokens` collects the prompt lengths vLLM expanded them to."""
    greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, "repetition_penalty": 1.0}

    def on_message(m, on_tokens):
        if prompt_tokens is not None and "prompt_tokens" in m:
            prompt_tokens.add(m["prompt_tokens"])
        on_tokens(len(m["tokens"]), m["finish_reason"] is not None)

    def submit(image, on_tokens):
        engine.submit(engine.new_id(), ids, None, greedy, new_tokens, list(eos_token_ids),
                      lambda m: on_message(m, on_tokens), image=np.asarray(image))

    return submit, lambda: None


def placeholder_ids(pipe, prompt=PROMPT) -> list[int]:
    """The prompt's ids with the image's run of tokens as one placeholder, which vLLM expands itself."""
    from mmtrt.handoff.vllm_scheduler import collapse_image_runs

    return collapse_image_runs(pipe.prompt_ids(prompt), pipe.model["image_token_id"])


def rounds(engines: dict, rng, size, repeats: int) -> list[tuple]:
    """Each engine warmed up, then per client count `repeats` rounds of one run per engine in turn; medians."""
    for submitter in engines.values():
        for clients in (8, 1):
            timed(*submitter, images(rng, clients, size))
    rows = []
    for clients in (1, 8):
        runs = {name: [] for name in engines}
        for _ in range(repeats):
            for name, submitter in engines.items():
                runs[name].append(timed(*submitter, images(rng, clients, size)))
                print(name, clients, runs[name][-1], flush=True)
        rows += [(name, clients, *(statistics.median(r[k] for r in runs[name])
                                   for k in ("ttft_ms", "decode_ms", "tokens_per_s"))) for name in engines]
    return rows


def agreement(plain, pruned, rng, size, count: int = 4) -> dict:
    """The pruned split's and vLLM alone's top-1 agreement with the plain split's greedy answers."""
    from mmtrt.handoff.vllm_agreement import answer_agreement, top1_agreement_pct

    split, alone, tokens = [], [], set()
    for image in images(rng, count, size):
        answer = plain.generate(image, PROMPT, max_new_tokens=NEW_TOKENS)
        split.append(answer_agreement(pruned, image, PROMPT, answer.token_ids))
        alone.append(answer_agreement(plain, image, PROMPT, answer.token_ids, own_vision=True))
        tokens.add((answer.image_tokens, pruned.generate(image, PROMPT, max_new_tokens=1).image_tokens))
    return {"pruned_split": top1_agreement_pct(split), "vllm_alone": top1_agreement_pct(alone),
            "image_tokens": sorted(tokens)}


def mmtrt_cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "mmtrt.cli", *args], check=True, stdout=subprocess.DEVNULL)


def prepared(work: Path, model: str, layers) -> dict[str, Path]:
    """The checkpoint, its plain and token-pruned bundles and the plain one's export (each made once)."""
    from random_checkpoint import write_checkpoint
    from scale_models import MODELS as ARCHITECTURES

    spec, source = MODELS[model], work / "checkpoint"
    if not (source / "config.json").is_file():
        import torch

        write_checkpoint(source, *ARCHITECTURES[spec.get("architecture", model)](layers),
                         dtype=getattr(torch, spec["dtype"]))
    envelope = "envelope:\n  batch: {min: 1, opt: 1, max: 8}\n"
    budget = BUDGET if spec["evaluate"] else ""
    if budget and not (work / "agreement.jsonl").is_file():
        rng = np.random.default_rng(1)
        for i, image in enumerate(images(rng, 2, spec["size"])):
            image.save(work / f"agreement-{i}.png")
        (work / "agreement.jsonl").write_text("".join(
            json.dumps({"image": f"agreement-{i}.png", "prompt": PROMPT}) + "\n" for i in range(2)))
    vision = [f"  - {spec['vision']}\n"] if "vision" in spec else []
    recipes = {"plain": _passes(vision), "pruned": _passes([f"  - token_prune: {spec['prune']}\n", *vision]) + budget}
    out = {}
    for name, passes in recipes.items():
        out[name] = work / f"{name}.bundle"
        if not (out[name] / "manifest.json").is_file():
            (work / f"{name}.yaml").write_text(f"model: {{source: hf, path: {source}}}\n{passes}{envelope}")
            mmtrt_cli("compile", str(work / f"{name}.yaml"), "-o", str(out[name]), "--force")
    out["hf"] = work / "hf"
    if not (out["hf"] / "config.json").is_file():
        mmtrt_cli("export", "hf", str(out["plain"]), str(out["hf"]))
    return out


def _passes(lines: list[str]) -> str:
    return "passes:\n" + "".join(lines) if lines else ""


def measure(args, paths: dict[str, Path]) -> dict:
    from mmtrt.handoff.vllm_pipeline import load as load_split
    from mmtrt.handoff.vllm_pipeline import serving_loop
    from mmtrt.handoff.vllm_process import VllmProcess
    from mmtrt.runtime import load

    size, rng = MODELS[args.model]["size"], np.random.default_rng(0)
    result = {"rows": [], "prompt_tokens": {}, "agreement": {}}
    for name in ("plain", "pruned") if args.run else ():  # one at a time: each holds a real-size bundle's model
        ours = load(paths[name], threads=args.threads, spin=False)
        result["rows"] += rounds({f"mmtrt run ({name} bundle)": batch_submitter(ours)}, rng, size, args.repeats)
        del ours
        gc.collect()
    for dtype in args.dtypes:
        engine = VllmProcess()
        pipes = {name: load_split(paths[name], paths["hf"], dtype, 8, threads=args.threads, spin=False,
                                  engine=engine) for name in ("plain", "pruned")}
        loops = {name: serving_loop(pipe, 8) for name, pipe in pipes.items()}
        counted: set = set()
        try:
            alone = vllm_alone_submitter(engine, placeholder_ids(pipes["plain"]), pipes["plain"].model["eos_token_ids"],
                                         prompt_tokens=counted)
            result["rows"] += rounds({f"vLLM alone ({dtype})": alone,
                                      f"split, plain bundle + vLLM {dtype}": serving_submitter(loops["plain"]),
                                      f"split, token-pruned bundle + vLLM {dtype}": serving_submitter(loops["pruned"])},
                                     rng, size, args.repeats)
            result["agreement"][dtype] = agreement(pipes["plain"], pipes["pruned"], rng, size)
        finally:
            for loop in loops.values():
                loop.close()
            engine.close()
        result["prompt_tokens"][f"vLLM alone ({dtype})"] = sorted(counted)
    manifest = json.loads((paths["pruned"] / "manifest.json").read_text())
    result["declared"] = manifest["recipe"]["budgets"].get("agreement_top1_drop")
    result["measured"] = (manifest.get("evaluation") or {}).get("total_cost", {}).get("agreement_top1_drop")
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--work", type=Path, required=True, help="checkpoints, bundles and results, per model")
    parser.add_argument("--out", type=Path, help="the page, from every model's results under --work")
    parser.add_argument("--layers", type=int, nargs=2, help="vision and LLM layers, for a cheaper trial")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", default=DTYPES)
    parser.add_argument("--no-run", dest="run", action="store_false", help="leave out the `mmtrt run` rows")
    args = parser.parse_args()
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"  # all the cores mmtrt gets: none reserved
    work = args.work / args.model
    work.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d")
    load_before = os.getloadavg()
    result = measure(args, prepared(work, args.model, args.layers))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    result |= {"date": started, "commit": commit, "threads": args.threads, "repeats": args.repeats,
               "layers": args.layers, "dtypes": args.dtypes, "run": args.run, "load": [load_before, os.getloadavg()]}
    (work / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.out:
        write_page(args.work, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
