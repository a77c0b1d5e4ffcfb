"""docs/results/vllm-split.md from scripts/bench_vllm.py's results (WORK/MODEL/results.json): a table per model,
with each row's time to first token against vLLM alone's at the same dtype and clients."""

from __future__ import annotations

import json
from pathlib import Path

DTYPES = ["float32", "bfloat16"]

DESCRIPTIONS = {
    "smollm-llava": "zoo:dino-smollm-page's LLM class of size: a random-weight LLaVA with SmolLM2-135M's LLM (30 "
                    "layers, hidden 576) and a SigLIP of DINOv2 ViT-S/14's size at 224 px (256 image tokens), "
                    "float32 weights; every request one 224x224 image",
    "onevision-0.5b": "a random-weight LLaVA-OneVision-0.5B (SigLIP so400m/14 at 384, Qwen2-0.5B, vocabulary "
                      "151,936), a bfloat16 checkpoint as on the Hub, compiled and exported in float32; every request "
                      "one 500x300 image (its any-resolution grid)",
    "onevision-0.5b-int8-vision": "the same LLaVA-OneVision-0.5B checkpoint, both bundles with `int8_weights: "
                                  "{components: [vision], activations: dynamic}` (the vision tower's and "
                                  "projector's linears as ONNX Runtime's int8 GEMM; the exported folder's vision "
                                  "tower is the checkpoint's float one); every request one 500x300 image",
}


def ttft_ratio(rows: list, row: list) -> str:
    """vLLM alone's TTFT over this row's at the same dtype and clients: above 1, this row answers sooner."""
    dtype = next((d for d in ("float32", "bfloat16") if d in row[0]), None)
    alone = next((r for r in rows if r[0] == f"vLLM alone ({dtype})" and r[1] == row[1]), None)
    return f"{alone[2] / row[2]:.2f}x" if alone and row[0].startswith("split") else ""


def section(model: str, result: dict) -> list[str]:
    command = (f"PYTHONPATH=. python scripts/bench_vllm.py --model {model} --work DIR --out docs/results/vllm-split.md"
               + (f" --layers {' '.join(map(str, result['layers']))}" if result["layers"] else "")
               + (f" --dtypes {' '.join(result['dtypes'])}" if result.get("dtypes", DTYPES) != DTYPES else "")
               + ("" if result.get("run", True) else " --no-run"))
    tokens = sorted({tuple(t) for a in result["agreement"].values() for t in a["image_tokens"]})
    declared = (f"the pruned bundle declares agreement_top1_drop {result['declared']:g} (it measured "
                f"{result['measured']:g} at compile time)" if result["declared"] is not None else
                "the pruned bundle declares no budget (its compile-time evaluation does not fit this host at this "
                "size)")
    agreement = "; ".join(f"{d}: token-pruned split {a['pruned_split']:g}%, vLLM alone {a['vllm_alone']:g}%"
                          for d, a in result["agreement"].items())
    load = ", ".join(f"{a:.1f}" for a in result["load"][0]) + " before, " + ", ".join(
        f"{a:.1f}" for a in result["load"][1]) + " after"
    lines = [
        f"## {model}", "",
        f"Date: {result['date']}. Commit: {result['commit']}. Machine: 2-core x86-64 VM (AVX-512), 24 GB, no GPU, "
        f"shared with other jobs (load average {load}). Command: `{command}`.", "",
        f"{DESCRIPTIONS[model]}; the prompt \"Describe the picture in detail.\", 24 new tokens, greedy; every "
        "request's image unseen. `mmtrt run` runs its batch (every image encoded, then all decoded together); "
        "the split runs in `mmtrt serve --llm vllm`'s loop (each image encoded at admission and handed to vLLM, "
        f"which prefills it while the next one is encoded). {result['threads']} threads for every engine (ONNX "
        "Runtime not spinning; vLLM bound to the same cores), OMP_WAIT_POLICY=PASSIVE. 8 clients: 8 requests at "
        f"once, decoded together by each engine. Medians of {result['repeats']} rounds after a warm-up, the vLLM "
        "rows of one dtype interleaved. Image tokens per request (plain, token-pruned): "
        f"{', '.join(f'{a} and {b}' for a, b in tokens)}; prompt tokens as vLLM alone counted them: "
        + "; ".join(f"{', '.join(map(str, v))} ({k.split('(')[1].rstrip(')')})"
                    for k, v in result["prompt_tokens"].items()) + ".", "",
        f"Accuracy: {declared}. Top-1 agreement with the plain split's greedy answers on 4 unseen images, "
        f"teacher-forced: {agreement}. The weights are random, so these say how much the output moves, not "
        "whether it is right.", "",
        "| engine | clients | TTFT ms | decode ms/token | tokens/s | TTFT: vLLM alone's over this |",
        "| --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r[0]} | {r[1]} | {r[2]:.0f} | {r[3]:.1f} | {r[4]:.2f} | {ttft_ratio(result['rows'], r)} |"
              for r in result["rows"]]
    return lines + [""]


def write_page(work: Path, out: Path) -> None:
    lines = ["# vLLM beside mmtrt: the split against mmtrt alone and vLLM alone", "",
             "mmtrt's vision side (preprocessing, the bundle's vision encoder, token pruning, the projector) with "
             "vLLM as the LLM, fed with image_embeds, against `mmtrt run` on the same bundles and vLLM alone on the "
             "exported folder (its own preprocessing and vision tower).", ""]
    for model in DESCRIPTIONS:
        results = work / model / "results.json"
        if results.is_file():
            lines += section(model, json.loads(results.read_text()))
    out.write_text("\n".join(lines))
