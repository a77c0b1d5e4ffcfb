"""`mmtrt profile`: every measurement of one or more bundles, the suggestions they support, and the report folder.

Order of work: every bundle is loaded; per bundle the ORT trace (which also gives the projector's share of the
vision kernel time, to split the vision stage, and measures the profiler's overhead); the stage rounds at each
batch size, alternating between the bundles round by round; then per bundle the context sweep, the prefill with
thinned image tokens and the heads on one request. One thread, spinning off (the machine may be shared); the
report puts later bundles beside the first as ratios per stage.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from mmtrt.errors import UserError
from mmtrt.profile import heads as heads_mod
from mmtrt.profile import pictures, stages, sweeps, trace
from mmtrt.progress import stage

KEEPS = (1.0, 0.5, 0.25)
REDUNDANT = 0.9


def profile_bundles(paths: list[Path], image, prompt: str, batches: list[int], contexts: list[int], rounds: int,
                    new_tokens: int, threads: int = 1) -> list[dict[str, Any]]:
    """Every measurement of every bundle; the stage rounds alternate between the bundles."""
    from mmtrt.runtime import load

    with stage("loading " + ", ".join(map(str, paths))):
        pipes = [load(path, threads=threads, spin=False) for path in paths]
    for pipe in pipes:
        for batch in batches:
            stages.check_request(pipe, batch, new_tokens)
    results = [_traced(pipe, image, prompt, new_tokens, rounds, threads) for pipe in pipes]
    for batch in batches:
        for result, row in zip(results, stages.measure(pipes, image, prompt, new_tokens, batch, rounds)):
            stages.split_vision(row["stages"], result["projector_share"])
            result["batches"].append(row)
    for pipe, result in zip(pipes, results):
        _shapes_and_heads(pipe, result, image, prompt, contexts, rounds, threads)
        result["suggestions"] = suggestions(result)
    return results


def _traced(pipe, image, prompt: str, new_tokens: int, rounds: int, threads: int) -> dict[str, Any]:
    one = partial(stages.request, image=image, prompt=prompt, new_tokens=new_tokens, batch=1)
    with stage(f"ONNX Runtime profiler on {pipe.path}"):
        traced = trace.profile_request(pipe, one, rounds=max(2, rounds), threads=threads)
    vision = traced["components"].get("vision")
    return {
        "bundle": str(pipe.path), "bundle_sha256": pipe.hash, "backends": pipe.backends, "prompt": prompt,
        "model": {"vision": pipe.model["vision"], "llm": pipe.model["llm"]}, "batches": [], "trace": traced,
        "profiler_overhead": _overhead(traced["wall_ms"]),
        "projector_share": _share(vision, "vision.projector") if vision else None,
    }


def _shapes_and_heads(pipe, result: dict[str, Any], image, prompt: str, contexts: list[int], rounds: int,
                      threads: int) -> None:
    ids = np.array([pipe.prompt_ids(prompt)], np.int64)
    pixels = pipe.pixel_values(image)
    embeds = pipe.embed(ids, pipe.image_features(pixels))
    result["context"] = sweeps.context_sweep(pipe, contexts, rounds, np.random.default_rng(0))
    result["prefill_keeps"] = sweeps.prefill_at_keeps(pipe, embeds, ids, KEEPS, rounds)
    with stage(f"heads and tokens of {pipe.path}"):
        result["heads"] = heads_mod.analyse(pipe, pixels, ids, threads)
    result["pixels"] = pixels


def _share(agg: dict[str, Any], bucket: str) -> float:
    """A layer bucket's share of a graph's kernel time (summed over the trace, as the wall time is)."""
    return agg["per_layer_us"].get(bucket, 0) / agg["total_us"]


def _overhead(walls: dict[str, list[float]]) -> dict[str, float]:
    plain, profiled = float(np.median(walls["plain"])), float(np.median(walls["profiled"]))
    return {"plain_ms": plain, "profiled_ms": profiled, "ratio": profiled / plain, "rounds": len(walls["plain"])}


def redundant_pairs(layers: list[dict[str, Any]], threshold: float = REDUNDANT) -> list[tuple[int, int, int, float]]:
    """(layer, head a, head b, cosine) for every pair of heads at or above `threshold`, most similar first."""
    pairs = []
    for row in layers:
        sim = np.asarray(row["similarity"])
        for a, b in zip(*np.triu_indices(len(sim), 1)):
            if sim[a, b] >= threshold:
                pairs.append((row["layer"], int(a), int(b), float(sim[a, b])))
    return sorted(pairs, key=lambda p: -p[3])


def suggestions(result: dict[str, Any]) -> list[str]:
    out = []
    first = result["batches"][0]
    top = max((s for s, v in first["stages"].items() if v), key=lambda s: first["stages"][s]["share"])
    out.append(f"{top} is {100 * first['stages'][top]['share']:.0f} % of a request at batch {first['batch']}")
    for comp in ("vision", "llm"):
        group = _kv_group_size(result["model"][comp]) if comp == "llm" else 1
        for layer, a, b, cos in redundant_pairs(result["heads"][comp])[:3]:
            shared = group > 1 and a // group == b // group
            out.append(f"heads {a} and {b} of {comp} layer {layer} are redundant (output cosine {cos:.2f})"
                       + (": they share a KV group, which channel_prune removes only whole" if shared
                          else ": channel_prune removes heads"))
    keeps = {row["keep"]: row for row in result["prefill_keeps"]}
    share = first["image_tokens"] / first["prompt_tokens"]
    full = keeps[1.0]["prefill_ms"]
    for keep in (0.5, 0.25):
        out.append(f"{100 * share:.0f} % of prefill tokens are image tokens: token_prune keep {keep} would cut "
                   f"prefill from {full:.1f} ms to about {keeps[keep]['prefill_ms']:.1f} ms "
                   f"(measured at {keeps[keep]['sequence']} tokens)")
    for comp, agg in result["trace"]["components"].items():
        bucket = max(agg["per_layer_us"], key=agg["per_layer_us"].get)
        if len(agg["per_layer_us"]) > 2 and ".layers." not in bucket:
            out.append(f"{bucket} is {100 * _share(agg, bucket):.0f} % of the {comp} kernel time"
                       + (" (logits at every prefill position; decoding reads only the last)"
                          if bucket.endswith("lm_head") else ""))
    llm = result["trace"]["components"].get("llm")
    if llm:
        op, us = next(iter(llm["per_op_us"].items()))
        out.append(f"{op} is {100 * us / llm['total_us']:.0f} % of the LLM's kernel time"
                   + (": awq_int4 lowers its linears to INT4" if op == "MatMul" else ""))
    return out


def _kv_group_size(llm: dict[str, Any]) -> int:
    return llm["num_heads"] // llm["num_kv_heads"]


def stage_ratios(results: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Per stage (batch 1), each later bundle's median over the first's."""
    base = results[0]["batches"][0]["stages"]
    out = {}
    for name, v in base.items():
        row = []
        for r in results[1:]:
            other = r["batches"][0]["stages"].get(name)
            row.append(other["median"] / v["median"] if v and other and v["median"] else None)
        out[name] = row
    walls = [r["batches"][0]["wall_ms"]["median"] for r in results]
    out["request"] = [w / walls[0] for w in walls[1:]]
    return out


def write_pictures(results: list[dict[str, Any]], folder: Path) -> dict[str, list[str]]:
    """Every picture of every bundle; file names per bundle index."""
    files: dict[str, list[str]] = {}
    for k, r in enumerate(results):
        name = Path(r["bundle"]).name
        made = [pictures.waterfall(r["batches"][0]["stages"], folder / f"profile_{k}_stages.png", f"{name}, batch 1"),
                pictures.layer_bars(r["trace"], folder / f"profile_{k}_layers.png"),
                pictures.head_heatmaps(r["heads"], folder / f"profile_{k}_heads.png"),
                pictures.kv_context(r["context"], folder / f"profile_{k}_kv.png")]
        sal = r["heads"]["saliency"]
        scores = sal.get("cls_attention") or sal.get("norm")
        if scores and round(len(scores) ** 0.5) ** 2 == len(scores):
            label = "[CLS] attention" if sal.get("cls_attention") else "feature norm"
            kept = {keep: heads_mod.kept_patches(scores, keep) for keep in (0.5, 0.25)}
            sal["kept"] = {str(k): v for k, v in kept.items()}
            made.append(pictures.saliency_overlay(r["pixels"], scores, kept, folder / f"profile_{k}_saliency.png",
                                                  label))
        files[r["bundle"]] = [p.name for p in made]
    if len(results) > 1:
        ratios = stage_ratios(results)
        files["compare"] = [pictures.stage_ratios([Path(r["bundle"]).name for r in results], ratios,
                                                  folder / "profile_compare.png").name]
    return files


def run(bundles: list[Path], image, prompt: str, batches: list[int], contexts: list[int], out: Path,
        rounds: int = 5, new_tokens: int = 16, threads: int = 1) -> dict[str, Any]:
    """Profile every bundle and write OUT/report.json, OUT/index.html, the pictures and a Chrome trace each."""
    from mmtrt.profile.html import write_html

    for b in bundles:
        if not (Path(b) / "manifest.json").is_file():
            raise UserError(f"{b} is not a bundle (no manifest.json); pass a folder written by `mmtrt compile`")
        model = json.loads((Path(b) / "manifest.json").read_text()).get("model", {})
        if "anyres" in model.get("vision", {}):
            raise UserError(f"{b} holds a {model.get('architecture')} model, which tiles each image; `mmtrt profile` "
                            "times fixed-size images only: profile it with `mmtrt run --json` timings instead")
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a folder; pass another -o")
    results = profile_bundles([Path(b) for b in bundles], image, prompt, batches, contexts, rounds, new_tokens,
                              threads)
    out.mkdir(parents=True, exist_ok=True)
    files = write_pictures(results, out)
    for k, r in enumerate(results):
        traces = r["trace"]["components"]
        (out / f"trace_{k}.json").write_text(json.dumps(trace.chrome_trace(traces)))
        for agg in traces.values():
            agg.pop("events")
        r.pop("pixels")
        r["trace_file"] = f"trace_{k}.json"
    report = {"bundles": results, "pictures": files,
              "stage_ratios": stage_ratios(results) if len(results) > 1 else None}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    write_html(report, out / "index.html")
    return report


def format_text(report: dict[str, Any]) -> str:
    """The stage table per bundle, ratios when several, and the suggestions."""
    lines = []
    for r in report["bundles"]:
        first = r["batches"][0]
        lines.append(f"{r['bundle']}  (batch {first['batch']}, {first['prompt_tokens']} prompt tokens, "
                     f"{first['new_tokens']} new)")
        for name, v in first["stages"].items():
            if v:
                lines.append(f"  {name:15s} {v['median']:9.2f} ms  [{v['p25']:.2f}..{v['p75']:.2f}]  "
                             f"{100 * v['share']:5.1f} %")
        lines.append(f"  {'  per token':15s} {first['decode_ms_per_token']:9.2f} ms  "
                     f"({first['new_tokens'] - 1} decode steps)")
        lines.append(f"  {'request':15s} {first['wall_ms']['median']:9.2f} ms")
        for row in r["batches"]:
            lines.append(f"  batch {row['batch']}: {row['requests_per_s']:.2f} requests/s, "
                         f"{row['tokens_per_s']:.1f} tokens/s")
        lines.append(f"  profiler overhead: {r['profiler_overhead']['ratio']:.2f}x")
        lines.extend(f"  - {s}" for s in r["suggestions"])
    if report["stage_ratios"]:
        lines.append("ratios to " + report["bundles"][0]["bundle"] + ": " + ", ".join(
            f"{k} {v[0]:.2f}x" for k, v in report["stage_ratios"].items() if v and v[0] is not None))
    return "\n".join(lines)
