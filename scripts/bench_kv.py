"""KV cache layouts measured side by side: decode step time, batched throughput, KV memory waste, repeat-question TTFT.

- Step time: one decode step of the LLM graph at a given context, for the exporter's growing cache (`hf`: past in,
  a grown copy out, fresh arrays every call) and the graphs `kv_layout` writes from the same graph (`static`:
  shared buffers through IOBinding; `paged`: block pool, shuffled block table). The graphs are taken from a
  bundle's llm.onnx (fp32, and INT4 when given) and driven directly with random embeddings and cache contents, so
  contexts beyond the bundle's envelope can be measured. Rounds alternate hf, static, paged; medians.
- Throughput: the same 8 requests (one image, mixed prompt lengths) through `generate_batch` with the batch
  capped at 1, 2, 4, 8, against the hf bundle running them one after another. Tokens/s counts generated tokens.
- Waste: for those 8 requests, KV positions reserved against held: contiguous rows at the envelope's capacity
  against paged blocks.
- TTFT: questions 2-4 on one image against question 1, on the static bundle (prefix reuse) of the given recipe.
- genai: onnxruntime-genai beside the INT4 bundle on the same SmolLM2-135M weights (its builder's INT4 from the
  zoo's GGUF, dequantized), both prefilling the same 101 token ids and decoding 64; each run a fresh process
  (scripts/bench_genai_worker.py) so peak RSS is the engine's alone. onnxruntime-genai lives in a virtual
  environment of its own (build/genai-venv: it requires the CPU `onnxruntime` package, which must not replace ours).
1 thread, spinning off (OMP_WAIT_POLICY=PASSIVE, allow_spinning=0): the machine is shared, so read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import yaml  # noqa: E402

from benchlib import lossless_ir, write_bundle  # noqa: E402
from mmtrt.backends.onnxruntime_backend import session_options  # noqa: E402
from mmtrt.bundle.manifest import read_manifest  # noqa: E402
from mmtrt.ir.graph import Component, ModelIR, graph_io  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
from mmtrt.runtime.batch import Request  # noqa: E402
from passes.kv.kv_layout import KvLayout  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONTEXTS = (64, 256, 1024, 2048)
BLOCK = 16
BUILD = ROOT / "build"
WORKER = ROOT / "scripts" / "bench_genai_worker.py"
PROMPT = ("Write a long story about a lighthouse keeper who finds an old map in the wall of the tower, "
          "and tell where it leads. ") * 8


def derived_graph(bundle: Path, layout: str, out: Path) -> Path:
    """The bundle's LLM graph rewritten by kv_layout, saved beside `out`."""
    manifest = read_manifest(bundle)
    model = onnx.load(bundle / "llm.onnx")
    comp = Component("llm", graph_io(model, "inputs"), graph_io(model, "outputs"), onnx=model)
    KvLayout(KvLayout.Config(layout=layout)).run(ModelIR({"llm": comp}, dict(manifest["model"]), {}))
    path = out / f"{bundle.name}.{layout}.onnx"
    onnx.save_model(comp.onnx, path, save_as_external_data=True, location=path.name + ".data")
    return path


class Step:
    """One decode step at context `ctx` for one layout; `__call__` runs it as the runtime would."""

    def __init__(self, path: Path, layout: str, llm: dict, ctx: int, rng):
        self.sess = ort.InferenceSession(str(path), session_options(1, False), providers=["CPUExecutionProvider"])
        self.layout, self.ctx = layout, ctx
        heads, dim = llm["num_kv_heads"], llm["head_dim"]
        names = [i.name for i in self.sess.get_inputs() if i.name.startswith("past.")]
        self.embeds = rng.standard_normal((1, 1, llm["hidden_size"])).astype(np.float32)
        if layout == "hf":
            self.past = {n: rng.standard_normal((1, heads, ctx, dim)).astype(np.float32) for n in names}
            return
        blocks = -(-(ctx + 1) // BLOCK)
        shape = (1, heads, ctx + BLOCK, dim) if layout == "static" else (blocks * BLOCK, heads, dim)
        self.buffers = {n: rng.standard_normal(shape).astype(np.float32) for n in names}
        self.table = rng.permutation(blocks)[None].astype(np.int64)

    def __call__(self) -> None:
        pos = np.array([[self.ctx]], np.int64)
        if self.layout == "hf":
            self.sess.run(None, {"inputs_embeds": self.embeds, "attention_mask": np.ones((1, self.ctx + 1), np.int64),
                                 "position_ids": pos, **self.past})
            return
        io = self.sess.io_binding()
        io.bind_cpu_input("inputs_embeds", self.embeds)
        io.bind_cpu_input("position_ids", pos)
        io.bind_cpu_input("logits_from", np.array([0], np.int64))
        if self.layout == "static":
            io.bind_cpu_input("seqlens_k", np.array([self.ctx], np.int32))
            io.bind_cpu_input("total_sequence_length", np.array(self.ctx + 1, np.int32))
        else:
            slot = self.table[0, self.ctx // BLOCK] * BLOCK + self.ctx % BLOCK
            io.bind_cpu_input("slot_mapping", np.array([[slot]], np.int64))
            io.bind_cpu_input("block_table", self.table)
        for name, buf in self.buffers.items():
            value = ort.OrtValue.ortvalue_from_numpy(buf)
            io.bind_ortvalue_input(name, value)
            io.bind_ortvalue_output(name.replace("past.", "present."), value)
        io.bind_output("logits")
        self.sess.run_with_iobinding(io)


def step_times(bundle: Path, tmp: Path, rounds: int, steps: int) -> list[dict]:
    llm = read_manifest(bundle)["model"]["llm"]
    graphs = {"hf": bundle / "llm.onnx", **{lay: derived_graph(bundle, lay, tmp) for lay in ("static", "paged")}}
    rows, rng = [], np.random.default_rng(0)
    for ctx in CONTEXTS:
        runs = {lay: Step(path, lay, llm, ctx, rng) for lay, path in graphs.items()}
        for run in runs.values():
            run()
        times = {lay: [] for lay in runs}
        for _ in range(rounds):
            for lay, run in runs.items():
                t0 = time.perf_counter()
                for _ in range(steps):
                    run()
                times[lay].append(1e3 * (time.perf_counter() - t0) / steps)
        med = {lay: statistics.median(t) for lay, t in times.items()}
        rows.append({"bundle": bundle.name, "context": ctx, **{f"{k}_ms": round(v, 2) for k, v in med.items()},
                     "hf/static": round(med["hf"] / med["static"], 2), "hf/paged": round(med["hf"] / med["paged"], 2)})
        print(rows[-1], flush=True)
        del runs
    return rows


def bench_recipe(recipe: Path, tmp: Path) -> Path:
    data = yaml.safe_load(recipe.read_text())
    data["envelope"].update(batch={"min": 1, "opt": 1, "max": 8}, prompt_tokens={"min": 1, "opt": 40, "max": 256},
                            max_new_tokens=32)
    out = tmp / f"{recipe.stem}.bench.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def mixed_requests(image, n: int = 8) -> list[Request]:
    words = "describe the picture and say what is in front, what is behind and which colours you see".split()
    return [Request(image, " ".join(words[: 2 + (5 * i) % len(words)]) * (1 + i % 3), 32) for i in range(n)]


def throughput(pipes: dict, image, rounds: int) -> list[dict]:
    """Every round runs every configuration once (alternating); tokens/s medians over the rounds."""
    reqs, speeds = mixed_requests(image), {}
    for pipe in pipes.values():
        pipe.prefixes.limit = 0  # static: every request computes its own prefix (batching alone); paged requests
        # of one batch still share the image prefix's blocks (a live holder's, not the cross-call cache)
        pipe.generate_batch(reqs[:1])
    configs = [(name, cap) for cap in (1, 2, 4, 8) for name in ("static", "paged")] + [("hf", 1)]
    for _ in range(rounds):
        for name, cap in configs:
            t0 = time.perf_counter()
            if name == "hf":  # the same requests one after another
                out = [pipes["hf"].generate_batch([r])[0] for r in reqs]
            else:
                _cap(pipes[name], cap)
                out = pipes[name].generate_batch(reqs)
            tokens = sum(len(g.token_ids) for g in out)
            speeds.setdefault((name, cap), []).append(tokens / (time.perf_counter() - t0))
    rows = [{"layout": name, "batch": cap, "tokens_per_s": round(statistics.median(v), 1)}
            for (name, cap), v in speeds.items()]
    lengths = [g.prompt_tokens + len(g.token_ids) for g in out]
    capacity = pipes["static"].dims["capacity"]["max"]
    contiguous, paged = capacity * len(lengths), sum(-(-n // BLOCK) * BLOCK for n in lengths)
    rows.append({"waste": "contiguous", "reserved": contiguous, "held": sum(lengths),
                 "waste_pct": round(100 * (1 - sum(lengths) / contiguous), 1)})
    rows.append({"waste": f"paged ({BLOCK}-token blocks)", "reserved": paged, "held": sum(lengths),
                 "waste_pct": round(100 * (1 - sum(lengths) / paged), 1)})
    for r in rows:
        print(r, flush=True)
    return rows


def _cap(pipe, batch: int) -> None:
    if hasattr(pipe.stepper, "batch_max"):
        pipe.stepper.batch_max = batch
    else:
        pipe.stepper.cache.rows = batch


def ttft(pipe, image, rounds: int) -> dict:
    questions = ["What is in the picture?", "What colours do you see?", "Is there a person?", "Where is it?"]
    first, later = [], []
    for _ in range(rounds):
        pipe.prefixes.entries.clear()
        pipe.prefixes.nbytes = 0
        times = []
        for q in questions:
            g = pipe.generate(image, q, 1)
            times.append(sum(g.timings[k] for k in ("preprocess_ms", "vision_ms", "prefill_ms")))
        first.append(times[0])
        later.append(statistics.median(times[1:]))
    row = {"first_ms": round(statistics.median(first), 1), "later_ms": round(statistics.median(later), 1)}
    row["later/first"] = round(row["later_ms"] / row["first_ms"], 3)
    print(row, flush=True)
    return row


def genai_python() -> Path:
    """build/genai-venv's python, created with onnxruntime-genai (from PyPI) on first use."""
    python = BUILD / "genai-venv" / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(python.parents[1])], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "onnxruntime-genai"], check=True)
    return python


def genai_model(python: Path, threads: int = 1) -> Path:
    """onnxruntime-genai's INT4 CPU model of SmolLM2-135M, built by its model builder from the zoo's weights; the
    builder runs under our python (it needs torch and transformers), from the genai venv's copy of its source."""
    out, hf = BUILD / "genai-int4", BUILD / "smollm2-hf"
    if not (hf / "config.json").exists():
        subprocess.run([sys.executable, "-c", SAVE_HF, str(hf)], check=True)
    if not (out / "genai_config.json").exists():
        site = subprocess.run([str(python), "-c", "import onnxruntime_genai, os; print(os.path.dirname("
                               "onnxruntime_genai.__file__))"], capture_output=True, text=True, check=True)
        builder = Path(site.stdout.strip()) / "models" / "builder.py"
        subprocess.run([sys.executable, str(builder), "-i", str(hf), "-o", str(out), "-p", "int4", "-e", "cpu",
                        "-c", str(BUILD / "genai-cache")], check=True, capture_output=True)
    config = json.loads((out / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"].update(intra_op_num_threads=threads, inter_op_num_threads=1)
    (out / "genai_config.json").write_text(json.dumps(config, indent=4))
    return out


# The zoo's SmolLM2 comes from a GGUF, which transformers will not save; the dequantized weights are copied into a
# plain LlamaForCausalLM first.
SAVE_HF = """
import sys
from transformers import LlamaForCausalLM
from mmtrt.zoo.pretrained import smollm2_from_gguf
model, tokenizer = smollm2_from_gguf()
config = model.config
config.__dict__.pop("quantization_config", None)
plain = LlamaForCausalLM(config).float().eval()
plain.load_state_dict(model.state_dict())
plain.save_pretrained(sys.argv[1])
tokenizer.save_pretrained(sys.argv[1])
"""


def prompt_ids(bundle: Path, n: int = 101) -> list[int]:
    """A whole chat-templated request of exactly n tokens (a cut one makes the model stop at once)."""
    from mmtrt.runtime.tokenizer import BundleTokenizer

    tok = BundleTokenizer(bundle / "tokenizer")
    template = (bundle / "tokenizer" / "chat_template.jinja").read_text()
    words = PROMPT.split()
    for lead, count in ((lead, count) for lead in ("", "Please: ") for count in range(len(words), 0, -1)):
        text = tok.apply_chat_template([{"role": "user", "content": lead + " ".join(words[:count])}], template,
                                       add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) == n:
            return ids
    raise SystemExit(f"no prefix of the benchmark prompt templates to {n} tokens; change PROMPT")


def versus_genai(bundles: list[Path], rounds: int, threads: int = 1, new: int = 64) -> list[dict]:
    """Alternating fresh processes (genai, then each bundle), medians; ratios against genai. Above 1 thread each
    engine keeps its default waiting (spinning thread pools: ONNX Runtime's and mmtrt's `load` default)."""
    python = genai_python()
    engines = {"onnxruntime-genai": [str(python), str(WORKER), "genai", str(genai_model(python, threads))]}
    engines.update({b.name: [sys.executable, str(WORKER), "mmtrt", str(b)] for b in bundles})
    ids = json.dumps(prompt_ids(bundles[0]))
    runs = {name: [] for name in engines}
    for _ in range(rounds):
        for name, cmd in engines.items():
            out = subprocess.run(cmd + [ids, str(new), str(threads)], capture_output=True, text=True,
                                 check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    rows = []
    for name, results in runs.items():
        row = {"engine": name, "layout": results[0]["layout"]}
        row.update({k: round(statistics.median(r[k] for r in results), 1)
                    for k in ("prefill_tok_s", "decode_tok_s", "decode_cpu_ms", "peak_rss_mib")})
        rows.append(row)
    base = rows[0]
    for row in rows:
        row.update({"prefill_vs_genai": round(row["prefill_tok_s"] / base["prefill_tok_s"], 2),
                    "decode_vs_genai": round(row["decode_tok_s"] / base["decode_tok_s"], 2),
                    "decode_cpu_vs_genai": round(base["decode_cpu_ms"] / row["decode_cpu_ms"], 2),
                    "rss_vs_genai": round(row["peak_rss_mib"] / base["peak_rss_mib"], 2)})
        print(row, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundles", type=Path, nargs="+", default=[Path("/work/bundles/dino-smollm.bundle")],
                    help="bundles whose LLM graph is timed per step (fp32, INT4)")
    ap.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "dino-smollm.yaml")
    ap.add_argument("--ttft-recipe", type=Path, default=ROOT / "recipes" / "dino-smollm-page.yaml")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--genai-bundles", type=Path, nargs="+", default=[Path("/work/bundles/dino-smollm-int4.bundle")],
                    help="INT4 bundles run beside onnxruntime-genai (a static-layout one where available)")
    ap.add_argument("--genai-threads", type=int, default=1, help="intra-op threads of both engines in the genai step")
    ap.add_argument("--skip", nargs="*", default=[], choices=["steps", "batch", "ttft", "genai"])
    args = ap.parse_args()
    from PIL import Image

    image = Image.fromarray((np.random.default_rng(0).random((224, 224, 3)) * 255).astype(np.uint8))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "steps" not in args.skip:
            for bundle in args.bundles:
                step_times(bundle, tmp, args.rounds, args.steps)
        if "batch" not in args.skip:
            recipe = bench_recipe(args.recipe, tmp)
            ir, reports = lossless_ir(recipe)
            paths = {"hf": write_bundle(recipe, ir, reports, None, tmp / "hf", ())[0]}
            for lay in ("static", "paged"):
                paths[lay] = write_bundle(recipe, ir, reports, {"kv_layout": {"layout": lay}}, tmp / lay, ("llm",))[0]
            del ir
            throughput({k: load(p, threads=1, spin=False) for k, p in paths.items()}, image, args.rounds)
        if "ttft" not in args.skip:
            ir, reports = lossless_ir(args.ttft_recipe)
            path = write_bundle(args.ttft_recipe, ir, reports, {"kv_layout": {"layout": "static"}}, tmp / "page",
                                ("llm",))[0]
            del ir
            ttft(load(path, threads=1, spin=False), image, args.rounds)
    if "genai" not in args.skip:
        versus_genai(args.genai_bundles, args.rounds, args.genai_threads)


if __name__ == "__main__":
    main()
