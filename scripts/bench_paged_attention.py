"""The paged layout's decode attention, one layer: today's gather + transpose form against forms that skip copies.

`python scripts/bench_paged_attention.py [--batch 8] [--context 112] [--runs 200] [--threads 2]`

Shapes of SmolLM2-135M (9 query heads, 3 key/value heads of 64), blocks of 16 tokens, one new token per sequence.
`gather+transpose` is what `kv_layout: paged` writes today (passes/kv/paged.py): each sequence's blocks gathered
from the token-major pool `[slots, H_kv, D]` in table order, reshaped to `[B, ctx, H_kv, D]`, transposed to heads
first, and ONNX's Attention (opset 23) with the causal mask. `gather, 3-D attention` gathers the same blocks but
hands Attention 3-D `[B, ctx, H_kv * D]` keys and values (a reshape, no copy) with `q_num_heads`/`kv_num_heads`,
so no transpose runs in the graph. `no gather (contiguous)` is the floor: Attention on keys already laid out per
sequence, as the static layout's buffers are. Median microseconds per call, and the largest difference of each
form's output from the first form's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

HQ, HKV, D, BT = 9, 3, 64, 16


def model(form: str, batch: int, blocks: int) -> onnx.ModelProto:
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    ctx = blocks * BT
    consts = {"blocks": [-1, BT, HKV, D], "ctx4": [0, -1, HKV, D], "ctx3": [0, -1, HKV * D], "q3": [0, 0, HQ * D],
              "heads": [0, 1, HQ, D]}
    nodes = [helper.make_node("Constant", [], [k], value=helper.make_tensor(k, i64, [len(v)], v))
             for k, v in consts.items()]
    inputs = [helper.make_tensor_value_info("q", f, [batch, HQ, 1, D]),
              helper.make_tensor_value_info("mask", TensorProto.BOOL, [batch, 1, 1, ctx])]
    if form == "no gather (contiguous)":
        inputs += [helper.make_tensor_value_info(n, f, [batch, HKV, ctx, D]) for n in ("k", "v")]
        nodes.append(helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"]))
    else:
        inputs += [helper.make_tensor_value_info(n, f, ["slots", HKV, D]) for n in ("kpool", "vpool")]
        inputs.append(helper.make_tensor_value_info("table", i64, [batch, blocks]))
        for n in ("k", "v"):
            nodes += [helper.make_node("Reshape", [f"{n}pool", "blocks"], [f"{n}b"]),
                      helper.make_node("Gather", [f"{n}b", "table"], [f"{n}g"], axis=0)]
            if form == "gather+transpose":
                nodes += [helper.make_node("Reshape", [f"{n}g", "ctx4"], [f"{n}s"]),
                          helper.make_node("Transpose", [f"{n}s"], [n], perm=[0, 2, 1, 3])]
            else:
                nodes.append(helper.make_node("Reshape", [f"{n}g", "ctx3"], [n]))
        if form == "gather+transpose":
            nodes.append(helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"]))
        else:
            nodes += [helper.make_node("Transpose", ["q"], ["qs"], perm=[0, 2, 1, 3]),
                      helper.make_node("Reshape", ["qs", "q3"], ["q3d"]),
                      helper.make_node("Attention", ["q3d", "k", "v", "mask"], ["y3"], q_num_heads=HQ,
                                       kv_num_heads=HKV),
                      helper.make_node("Reshape", ["y3", "heads"], ["y4"]),
                      helper.make_node("Transpose", ["y4"], ["y"], perm=[0, 2, 1, 3])]
    graph = helper.make_graph(nodes, form, inputs, [helper.make_tensor_value_info("y", f, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


def feeds(rng, batch: int, blocks: int) -> dict[str, dict[str, np.ndarray]]:
    """The same keys and values as a pool (blocks scattered) and as contiguous per-sequence buffers."""
    pool_blocks = batch * blocks + 16
    kpool, vpool = (rng.standard_normal((pool_blocks * BT, HKV, D)).astype(np.float32) for _ in range(2))
    table = rng.permutation(pool_blocks)[:batch * blocks].reshape(batch, blocks).astype(np.int64)
    lengths = rng.integers((blocks - 1) * BT + 1, blocks * BT + 1, batch)
    mask = (np.arange(blocks * BT)[None, :] < lengths[:, None])[:, None, None, :]
    q = rng.standard_normal((batch, HQ, 1, D)).astype(np.float32)

    def contiguous(pool):
        return pool.reshape(-1, BT, HKV, D)[table].reshape(batch, -1, HKV, D).transpose(0, 2, 1, 3).copy()

    paged = {"q": q, "mask": mask, "kpool": kpool, "vpool": vpool, "table": table}
    return {"paged": paged, "contiguous": {"q": q, "mask": mask, "k": contiguous(kpool), "v": contiguous(vpool)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("batch", 8), ("context", 112), ("runs", 200), ("threads", 2)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    blocks = -(-args.context // BT)
    data = feeds(np.random.default_rng(0), args.batch, blocks)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # the contiguous form leaves the pool's reshape constant unused
    forms = ("gather+transpose", "gather, 3-D attention", "no gather (contiguous)")
    sessions = {form: ort.InferenceSession(model(form, args.batch, blocks).SerializeToString(), options,
                                           providers=["CPUExecutionProvider"]) for form in forms}
    inputs = {form: data["contiguous" if "contiguous" in form else "paged"] for form in forms}
    reference = sessions[forms[0]].run(None, inputs[forms[0]])[0]
    times = {form: [] for form in forms}
    for _ in range(args.runs):  # interleaved, so the machine's load falls on every form alike
        for form in forms:
            t0 = time.perf_counter()
            out = sessions[form].run(None, inputs[form])[0]
            times[form].append(1e6 * (time.perf_counter() - t0))
    print(f"batch {args.batch}, context {blocks * BT} ({blocks} blocks of {BT}), {HQ}/{HKV} heads of {D}; "
          f"median of {args.runs} interleaved calls, {args.threads} threads\n")
    print("| form | us per call | against gather+transpose | max abs diff |\n| --- | ---: | ---: | ---: |")
    base = statistics.median(times[forms[0]])
    for form in forms:
        out = sessions[form].run(None, inputs[form])[0]
        t = statistics.median(times[form])
        print(f"| {form} | {t:.1f} | {t / base:.2f}x | {float(np.abs(out - reference).max()):.1e} |")


if __name__ == "__main__":
    main()
