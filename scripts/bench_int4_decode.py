"""Where an INT4 LLM's decode step goes on the CPU, and what its float zero points cost there.

`awq_int4` with `zero_point: float` lowers each linear to a MatMulNBits without zero points, plus a small float
MatMul of its input's per-group sums by the offsets, and an Add (mmtrt/quant/int4.py: `matmulnbits_offset_nodes`).
This script times one decode step of bundles' LLMs (`kv_layout: static` bundles: GroupQueryAttention over a KV
buffer) at a given context, side by side in one run (round robin, medians): each bundle as compiled (two bundles
of one checkpoint: two recipes), and with `--forms` two other forms of the first bundle's graph:

- the offsets dropped and a 4-bit zero point per group added: ONNX Runtime's own asymmetric form
  (`zero_point: int4`), the same kernels and bytes as such a compile;
- the offsets dropped, no zero points: the symmetric form's kernels and bytes.

Those two compute other numbers (their zero points are not the model's): they time the graph's form only; what
a grid costs in accuracy is the accuracy budgets' to say. They take a graph whose linears are not fused
(`fuse_projections`). `--indicator-sums` adds the first bundle with its group sums as MatMuls by a [K, G] group
indicator (the same numbers). It also prints the first bundle's time per ONNX Runtime op type (its profiler).

    PYTHONPATH=. python scripts/bench_int4_decode.py BUNDLE [BUNDLE ...] [--forms] [--indicator-sums]
        [--context 2049] [--tokens 1] [--graph llm.onnx] [--steps 25] [--rounds 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from mmtrt.quant.int4 import group_indicator


def variant(model: onnx.ModelProto, zero_points: bool) -> onnx.ModelProto:
    """`model` without the offset MatMuls and Adds, each MatMulNBits writing the linear's output itself; with a
    4-bit zero point of 8 per group where `zero_points`."""
    out = onnx.ModelProto.FromString(model.SerializeToString())
    g = out.graph
    renamed = {n.input[0]: n.output[0] for n in g.node
               if n.op_type == "Add" and n.input[0].endswith(".int4_out")}
    dropped = {n.name for n in g.node if (n.op_type == "MatMul" and n.name.endswith(".offsets"))
               or ".group_sums." in n.name}
    dropped |= {n.name for n in g.node if n.op_type == "Add" and n.input[0] in renamed}
    kept = [n for n in g.node if n.name not in dropped]
    for n in kept:
        if n.op_type == "MatMulNBits":
            n.output[0] = renamed.get(n.output[0], n.output[0])
            if zero_points:
                attrs = {a.name: a.i for a in n.attribute}
                groups = -(-attrs["K"] // attrs["block_size"])
                zp = np.full(attrs["N"] * ((groups + 1) // 2), 0x88, np.uint8)
                g.initializer.append(numpy_helper.from_array(zp, f"{n.name}.zp"))
                n.input.append(f"{n.name}.zp")
    del g.node[:]
    g.node.extend(kept)
    used = {i for n in g.node for i in n.input}
    kept_inits = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept_inits)
    return out


def indicator_sums(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each float-zero-point group sum (Reshape and ReduceSum) computed as a MatMul of the input by the
    [K, G] group indicator instead: the same sums, another kernel."""
    out = onnx.ModelProto.FromString(model.SerializeToString())
    g = out.graph
    k_of = {n.input[0]: next(a.i for a in n.attribute if a.name == "K") for n in g.node if n.op_type == "MatMulNBits"}
    nodes = []
    for n in g.node:
        if ".group_sums." not in n.name or n.op_type == "MatMul":
            nodes.append(n)
        elif n.op_type == "ReduceSum":
            x, block = n.output[0].rsplit(".group_sums.b", 1)
            indicator = group_indicator(k_of[x], int(block), np.float32)
            g.initializer.append(numpy_helper.from_array(indicator, f"{n.output[0]}.indicator"))
            nodes.append(onnx.helper.make_node("MatMul", [x, f"{n.output[0]}.indicator"], [n.output[0]]))
    del g.node[:]
    g.node.extend(nodes)
    return out


def decode_feeds(sess: ort.InferenceSession, context: int, tokens: int = 1) -> dict[str, np.ndarray]:
    """`tokens` new tokens after `context` cached ones, random everywhere (the buffer a little longer)."""
    rng = np.random.default_rng(0)
    names = {i.name: i for i in sess.get_inputs()}
    if "seqlens_k" not in names:
        raise SystemExit("bench_int4_decode: the bundle's LLM has no GroupQueryAttention inputs; compile it with "
                         "kv_layout: {layout: static}")
    hidden = names["inputs_embeds"].shape[-1]
    capacity = context + tokens + 255
    feeds = {n: rng.standard_normal((1, i.shape[1], capacity, i.shape[3]), np.float32)
             for n, i in names.items() if n.startswith("past.")}
    feeds.update(inputs_embeds=rng.standard_normal((1, tokens, hidden), np.float32),
                 position_ids=np.arange(context, context + tokens)[None],
                 seqlens_k=np.array([context + tokens - 1], np.int32),
                 total_sequence_length=np.array(context + tokens, np.int32))
    if "logits_from" in names:
        feeds["logits_from"] = np.array([tokens - 1], np.int64)  # the last position, as the runtime asks
    return feeds


def options(threads: int, profile: bool = False) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.enable_profiling = profile
    return so


def bound(sess: ort.InferenceSession, feeds: dict) -> ort.IOBinding:
    """`feeds` bound as the runtime binds them: each cache buffer as both its past input and its present output."""
    io, outputs = sess.io_binding(), {o.name for o in sess.get_outputs()}
    for name, value in feeds.items():
        present = name.replace("past.", "present.", 1)
        if name.startswith("past.") and present in outputs:
            buffer = ort.OrtValue.ortvalue_from_numpy(value)
            io.bind_ortvalue_input(name, buffer)
            io.bind_ortvalue_output(present, buffer)
        else:
            io.bind_cpu_input(name, value)
    io.bind_output("logits")
    return io


def step_ms(sess: ort.InferenceSession, feeds: dict, steps: int) -> float:
    io, times = bound(sess, feeds), []
    for _ in range(steps):
        start = time.perf_counter()
        sess.run_with_iobinding(io)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[2:])


def op_shares(path: Path, feeds: dict, threads: int, steps: int) -> list[tuple[str, float, float]]:
    sess = ort.InferenceSession(str(path), options(threads, profile=True), providers=["CPUExecutionProvider"])
    io = bound(sess, feeds)
    for _ in range(steps):
        sess.run_with_iobinding(io)
    trace = Path(sess.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    total = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            total[e["args"]["op_name"]] += e["dur"] / 1000 / steps
    whole = sum(total.values())
    return [(op, ms, ms / whole) for op, ms in total.most_common(8)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--forms", action="store_true", help="also the first bundle with 4-bit and no zero points")
    parser.add_argument("--indicator-sums", action="store_true",
                        help="also the first bundle with its group sums as MatMuls by the group indicator")
    parser.add_argument("--context", type=int, default=2049)
    parser.add_argument("--tokens", type=int, default=1, help="new tokens per call (a prompt: --context 0)")
    parser.add_argument("--graph", default="llm.onnx", help="the bundle's LLM graph to time (llm_prefill.onnx)")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = {f"{b}, as compiled": b / args.graph for b in args.bundles}
        if args.forms:
            paths.update(other_forms(args.bundles[0] / args.graph, Path(tmp)))
        if args.indicator_sums:
            path = Path(tmp) / "indicator.onnx"
            onnx.save(indicator_sums(onnx.load(str(args.bundles[0] / args.graph))), str(path),
                      save_as_external_data=True, location="indicator.onnx.data")
            paths[f"{args.bundles[0]}, group sums by indicator MatMuls"] = path
        sessions = {form: ort.InferenceSession(str(p), options(args.threads), providers=["CPUExecutionProvider"])
                    for form, p in paths.items()}
        feeds = decode_feeds(next(iter(sessions.values())), args.context, args.tokens)
        times = {form: [] for form in sessions}
        for _ in range(args.rounds):
            for form, sess in sessions.items():
                times[form].append(step_ms(sess, feeds, args.steps))
        shares = op_shares(args.bundles[0] / args.graph, feeds, args.threads, args.steps)
    base = statistics.median(next(iter(times.values())))
    print(f"| LLM form | {args.graph} step ms (median of {args.rounds} runs) | speed vs the first |")
    print("| --- | ---: | ---: |")
    for form, runs in times.items():
        ms = statistics.median(runs)
        print(f"| {form} | {ms:.1f} | {base / ms:.2f}x |")
    print(f"\n| op type ({args.bundles[0]}) | ms per step | share |")
    print("| --- | ---: | ---: |")
    for op, ms, share in shares:
        print(f"| {op} | {ms:.1f} | {100 * share:.0f} % |")


def other_forms(graph: Path, tmp: Path) -> dict[str, Path]:
    """The bundle's LLM `graph` with 4-bit zero points, and with none, saved under `tmp`."""
    compiled = onnx.load(str(graph))
    paths = {}
    for form, name, zp in (("int4 zero points", "int4zp", True), ("symmetric (no zero points)", "sym", False)):
        path = tmp / f"{name}.onnx"
        onnx.save(variant(compiled, zp), str(path), save_as_external_data=True, location=f"{name}.onnx.data")
        paths[f"{graph.parent}, {form}"] = path
    return paths


if __name__ == "__main__":
    main()
