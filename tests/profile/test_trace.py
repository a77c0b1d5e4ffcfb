"""The ORT trace's aggregation accounts for every kernel of every graph, in the layer names the passes use."""

from functools import partial

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from builders import random_image
from mmtrt.profile import stages, trace
from mmtrt.profile.layers import layer_buckets
from mmtrt.quant.linears import find_linears
from mmtrt.runtime import load

ROUNDS = 2


def traced(bundle, rng, optimization=None):
    pipe = load(bundle, threads=1, spin=False)
    request = partial(stages.request, image=random_image(rng, 70, 90), prompt="What is this?", new_tokens=4)
    return pipe, trace.profile_request(pipe, request, rounds=ROUNDS, optimization=optimization)


def graph(pipe, name):
    return onnx.load(str(pipe.path / pipe.manifest["components"][name]["artifact"]), load_external_data=False)


def test_every_graph_node_runs_and_lands_in_one_layer_without_ort_optimisation(tiny_bundle, rng):
    pipe, out = traced(tiny_bundle, rng, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    for name, agg in out["components"].items():
        model = graph(pipe, name)
        nodes = {n.name for n in model.graph.node}
        assert agg["graph_nodes"] == agg["graph_nodes_run"] == len(nodes) == agg["ort_nodes"]
        assert set(agg["per_node"]) == nodes
        kernels = trace.kernel_events(trace.after_warmup(agg["events"], ROUNDS + 1))
        assert {e["name"][:-len(trace.KERNEL)] for e in kernels} == nodes
        total = sum(e["dur"] for e in kernels) / ROUNDS
        assert agg["total_us"] == pytest.approx(total)
        assert sum(agg["per_layer_us"].values()) == pytest.approx(total)
        assert sum(agg["per_op_us"].values()) == pytest.approx(total)
        medians = sum(v["median_us"] for v in agg["per_node"].values())
        assert sum(agg["per_layer_median_us"].values()) == pytest.approx(medians)
        assert sum(agg["per_op_median_us"].values()) == pytest.approx(medians)
        buckets, _ = layer_buckets(model, name)
        assert all(agg["per_node"][n]["layer"] == buckets[n] for n in nodes)


def test_shipping_trace_sums_to_the_kernels_and_uses_the_pass_layer_names(tiny_bundle, rng):
    pipe, out = traced(tiny_bundle, rng)
    llm = out["components"]["llm"]
    kernels = trace.kernel_events(trace.after_warmup(llm["events"], ROUNDS + 1))
    assert sum(llm["per_layer_us"].values()) == pytest.approx(sum(e["dur"] for e in kernels) / ROUNDS)
    assert llm["ort_nodes"] < llm["graph_nodes"]  # ORT's optimiser fused or folded some nodes
    _, linears, _ = find_linears(graph(pipe, "llm"), "llm")
    layers = {lin.name.rsplit(".", 1)[0] for lin in linears if lin.layer is not None}
    assert layers == {f"llm.layers.{i}" for i in range(pipe.model["llm"]["num_layers"])}
    assert layers <= set(llm["per_layer_us"]) and "llm.lm_head" in llm["per_layer_us"]
    assert "vision.projector" in out["components"]["vision"]["per_layer_us"]
    assert len(out["wall_ms"]["plain"]) == len(out["wall_ms"]["profiled"]) == ROUNDS
    peaks = [int(e["args"]["mem_in_use_peak"]) for e in kernels]
    assert llm["arena_peak_bytes"] == max(peaks) > 0


def test_median_per_request_is_robust_to_one_preempted_call():
    # two requests of three calls each; the second request's first call was preempted
    assert trace._median_per_request([10, 1, 1, 90, 1, 3], 2) == pytest.approx(50 + 1 + 2)
    assert trace._median_per_request([10, 1, 1, 12, 1, 1, 1000, 1, 1], 3) == pytest.approx(12 + 1 + 1)


def test_after_warmup_keeps_the_later_requests_runs(tiny_bundle, rng):
    _, out = traced(tiny_bundle, rng)
    events = out["components"]["llm"]["events"]
    runs = [e for e in events if e.get("name") == "model_run"]
    kept = [e for e in trace.after_warmup(events, ROUNDS + 1) if e.get("name") == "model_run"]
    assert len(kept) == len(runs) * ROUNDS // (ROUNDS + 1) and len(runs) == 4 * (ROUNDS + 1)


def test_chrome_trace_has_a_process_per_graph_and_complete_events(tiny_bundle, rng):
    _, out = traced(tiny_bundle, rng)
    chrome = trace.chrome_trace(out["components"])
    names = {e["args"]["name"]: e["pid"] for e in chrome["traceEvents"] if e["ph"] == "M"}
    assert set(names) == {"vision", "embed", "llm"} and len(set(names.values())) == 3
    complete = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert complete and all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in complete)
    assert {e["pid"] for e in complete} == set(names.values())


def test_layer_buckets_follow_the_latest_linear(tiny_bundle):
    model = onnx.load(str(tiny_bundle / "vision.onnx"), load_external_data=False)
    buckets, order = layer_buckets(model, "vision")
    assert order[0] == "vision.pre_layers" and order[-1] == "vision.projector"
    conv = next(n.name for n in model.graph.node if n.op_type == "Conv")
    assert buckets[conv] == "vision.pre_layers"
    attention = [n.name for n in model.graph.node if n.op_type == "Attention"]
    assert [buckets[n] for n in attention] == [f"vision.layers.{i}" for i in range(len(attention))]
    assert np.all(np.diff([order.index(buckets[n.name]) for n in model.graph.node if n.op_type == "MatMul"]) >= 0)
