"""One decode step of a paged bundle's LLM at batch 1, 2, 4, 8: what a batched step costs against a batch-1 step.

`python scripts/bench_decode_batch.py BUNDLE [--context 100] [--steps 12] [--rounds 3] [--threads 2] [--profile]`

The bundle's LLM graph runs in ONNX Runtime directly (no scheduler, no server): every sequence holds `--context`
tokens in the paged pool, then decode steps of one token per sequence are timed at each batch, the batches and the
graph variants alternating within each round (medians over the rounds' steps). Variants of the same graph:
- `bundle`: as compiled;
- `acc0`: every MatMulNBits with accuracy_level 0 (float activations);
- `float`: every MatMulNBits replaced by a float MatMul of its dequantized weight (the fp32 kernels on the same
  weights: the cost of a step without INT4).
`--prompt-tokens` adds one sequence's prefill of that many tokens (what an admission runs), against a batch-1 step.
`--profile` adds ONNX Runtime's per-operator time of one step at each batch (the bundle's graph), by op type.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

from mmtrt.backends.onnxruntime_backend import session_options  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
from mmtrt.runtime.paged import PagedCache, PagedStepper  # noqa: E402


def unpack_weight(node: onnx.NodeProto, inits: dict[str, np.ndarray]) -> np.ndarray:
    """The float [K, N] weight a 4-bit MatMulNBits multiplies by (zero point 8 when it has none)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    k, n, block = attrs["K"], attrs["N"], attrs["block_size"]
    packed = inits[node.input[1]].reshape(n, -1)
    q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, -1).astype(np.float32)
    groups = q.shape[1] // block
    if len(node.input) > 3 and node.input[3]:
        zp = inits[node.input[3]].reshape(n, -1)
        zero = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)[:, :groups].astype(np.float32)
    else:
        zero = np.full((n, groups), 8, np.float32)
    scales = inits[node.input[2]].reshape(n, groups).astype(np.float32)
    w = (q.reshape(n, groups, block) - zero[..., None]) * scales[..., None]
    return np.ascontiguousarray(w.reshape(n, -1)[:, :k].T)


def variant(model: onnx.ModelProto, kind: str) -> onnx.ModelProto:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or kind == "bundle":
            nodes.append(node)
        elif kind == "acc0":
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = 0
            nodes.append(node)
        else:
            weight = numpy_helper.from_array(unpack_weight(node, inits), f"{node.name}.float_weight")
            model.graph.initializer.append(weight)
            nodes.append(helper.make_node("MatMul", [node.input[0], weight.name], list(node.output), name=node.name))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


class Graph:
    """One session of a graph variant with a paged pool of its own, `batch_max` sequences of `context` tokens."""

    def __init__(self, pipe, path: Path, threads: int, context: int, profile: bool = False):
        session = ort.InferenceSession(str(path), session_options(threads, spin=False),
                                       providers=["CPUExecutionProvider"])
        cache = PagedCache(pipe.kv, pipe.model["llm"], pipe.dims)
        self.stepper, self.pipe, self.context = PagedStepper(session, cache, pipe.dims["batch"]["max"]), pipe, context
        batch = self.stepper.batch_max
        self.stepper.reset(batch)
        ids = np.random.default_rng(0).integers(100, 10000, (batch, context))
        for seq in range(batch):  # one sequence at a time: the prefill's activations stay small
            self.stepper.run(pipe.embed(ids[seq:seq + 1]), [self.stepper.direct[seq]], last_only=True)
        if profile:  # a session of its own, so that only decode steps are profiled
            opts = session_options(threads, spin=False)
            opts.enable_profiling, opts.profile_file_prefix = True, str(path.parent / "profile")
            self.stepper.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    def step(self, batch: int, tokens: int = 1) -> float:
        """One step of `tokens` new tokens for each of the first `batch` sequences (1: decode; more: a prefill)."""
        seqs = self.stepper.direct[:batch]
        for s in seqs:
            self.stepper.cache.lengths[s] = self.context
        embeds = self.pipe.embed(np.full((batch, tokens), 42, np.int64))
        t0 = time.perf_counter()
        self.stepper.run(embeds, seqs, last_only=True)
        return time.perf_counter() - t0


def op_times(session) -> dict[str, float]:
    events = json.loads(Path(session.end_profiling()).read_text())
    totals = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            totals[e["args"]["op_name"]] += e["dur"] / 1e3
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--variants", nargs="+", default=["bundle", "acc0", "float"])
    parser.add_argument("--context", type=int, default=100, help="tokens each sequence holds already")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, nargs="*", default=[16, 32],
                        help="also time one sequence's prefill of this many tokens (an admission)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    pipe = load(args.bundle, threads=args.threads, spin=False)
    source = onnx.load(str(args.bundle / pipe.manifest["components"]["llm"]["artifact"]))
    with tempfile.TemporaryDirectory(prefix="bench_decode_") as folder:
        paths = {}
        for kind in dict.fromkeys(["bundle", *args.variants]):
            paths[kind] = Path(folder) / f"{kind}.onnx"
            onnx.save(variant(source, kind), str(paths[kind]), save_as_external_data=True, location=f"{kind}.data")
        step_table(args, pipe, {kind: paths[kind] for kind in args.variants})
        if args.profile:
            profile_table(args, pipe, paths["bundle"])


def step_table(args, pipe, paths: dict[str, Path]) -> None:
    graphs = {kind: Graph(pipe, path, args.threads, args.context) for kind, path in paths.items()}
    times = defaultdict(list)
    for _ in range(args.rounds):
        for batch in args.batches:
            for kind, graph in graphs.items():
                graph.step(batch)  # warm-up at this batch's shapes
                times[kind, batch] += [graph.step(batch) for _ in range(args.steps)]
        for tokens in args.prompt_tokens:
            for kind, graph in graphs.items():
                graph.step(1, tokens)
                times[kind, f"prefill {tokens}"] += [graph.step(1, tokens) for _ in range(args.steps // 2 or 1)]
    print(f"context {args.context} tokens per sequence, {args.threads} threads, median ms per step "
          f"(x: against batch {args.batches[0]})\n")
    columns = list(args.batches) + [f"prefill {t}" for t in args.prompt_tokens]
    print("| variant | " + " | ".join(f"batch {c}" if isinstance(c, int) else f"{c} tokens (batch 1)"
                                     for c in columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for kind in graphs:
        first = statistics.median(times[kind, args.batches[0]])
        cells = [f"{1e3 * statistics.median(times[kind, c]):.1f} ({statistics.median(times[kind, c]) / first:.2f}x)"
                 for c in columns]
        print(f"| {kind} | " + " | ".join(cells) + " |")


def profile_table(args, pipe, path: Path) -> None:
    profiles = {}
    for batch in args.batches:
        graph = Graph(pipe, path, args.threads, args.context, profile=True)
        for _ in range(args.steps):
            graph.step(batch)
        profiles[batch] = {op: ms / args.steps for op, ms in op_times(graph.stepper.session).items()}
    ops = sorted(profiles[args.batches[-1]], key=profiles[args.batches[-1]].get, reverse=True)
    print("\nms per decode step by operator type (the bundle's graph, ONNX Runtime's profiler)\n")
    print("| op | " + " | ".join(f"batch {b}" for b in args.batches) + " |")
    print("| --- |" + " --- |" * len(args.batches))
    for op in ops[:12]:
        print(f"| {op} | " + " | ".join(f"{profiles[b].get(op, 0):.1f}" for b in args.batches) + " |")


if __name__ == "__main__":
    main()
