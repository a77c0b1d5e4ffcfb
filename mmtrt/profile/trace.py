"""ONNX Runtime's own profiler on the bundle's graphs, summed per op type and per transformer layer.

Each component gets a second session on the same artifact with `enable_profiling` and the options the runtime
uses (same threads, spinning and graph optimisation level), swapped into the loaded pipeline for one request, so
the trace is of what ships. ORT reports every kernel it ran as a `Node` event named after the node; nodes its
optimiser made (fusions such as `BiasGelu`, layout `ReorderOutput`) carry no bundle name and take the bucket of
the node that ran before them (the sequential executor runs in topological order); fused nodes named
`<original>/<Fusion>/` take their original's bucket. The raw events are kept for the Chrome trace export.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from mmtrt.backends.int8_gemm import graph_ops
from mmtrt.backends.onnxruntime_backend import OrtRunner, session_options
from mmtrt.profile.layers import layer_buckets
from mmtrt.progress import track

KERNEL = "_kernel_time"


class ProfiledRunner:
    """An ONNX Runtime session on one component with the profiler on; `events()` ends the profile."""

    def __init__(self, path: Path, threads: int | None, spin: bool, folder: Path, optimization=None):
        opts = session_options(threads, spin, ops=graph_ops(path))
        opts.enable_profiling = True
        opts.profile_file_prefix = str(folder / path.stem)
        if optimization is not None:
            opts.graph_optimization_level = optimization
        self.session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        self.providers = self.session.get_providers()
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds):
        return dict(zip(self.output_names, self.session.run(None, feeds)))

    def events(self) -> list[dict[str, Any]]:
        return json.loads(Path(self.session.end_profiling()).read_text())


def profile_request(pipe, request, rounds: int = 3, threads: int | None = 1, spin: bool = False,
                    optimization=None) -> dict[str, Any]:
    """Run `request(pipe)` with profiled sessions in place of the ORT ones, alternating with the plain sessions
    (A B A B after a warm-up of each), so the profiler's own overhead is measured beside the trace. Per
    component, the aggregation of the profiled rounds (warm-up dropped), per request."""
    components = [name for name in ("vision", "embed", "llm") if isinstance(pipe.runners[name], OrtRunner)]
    plain = dict(pipe.runners)
    walls: dict[str, list[float]] = {"plain": [], "profiled": []}
    with tempfile.TemporaryDirectory(prefix="mmtrt-trace-") as tmp:
        profiled = {name: ProfiledRunner(pipe.path / pipe.manifest["components"][name]["artifact"], threads, spin,
                                         Path(tmp), optimization) for name in components}
        try:
            for i in track(range(rounds + 1), "profiler rounds", total=rounds + 1):
                for kind, runners in (("plain", plain), ("profiled", profiled)):
                    pipe.runners.update(runners)
                    start = time.perf_counter()
                    request(pipe)
                    if i:
                        walls[kind].append(1e3 * (time.perf_counter() - start))
        finally:
            pipe.runners.update(plain)
        events = {name: runner.events() for name, runner in profiled.items()}
    out = {}
    for name in components:
        model = onnx.load(str(pipe.path / pipe.manifest["components"][name]["artifact"]), load_external_data=False)
        out[name] = aggregate(after_warmup(events[name], rounds + 1), model, name, rounds)
        out[name]["events"] = events[name]
    skipped = sorted({"vision", "embed", "llm"} - set(components))
    return {"components": out, "rounds": rounds, "wall_ms": walls,
            "not_profiled": {n: "runs on TensorRT or as a segment chain" for n in skipped}}


def after_warmup(events: list[dict[str, Any]], requests: int) -> list[dict[str, Any]]:
    """The events after the first request's session runs (each request makes the same number of runs)."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    per_request = len(runs) // requests
    if not per_request:
        return events
    cutoff = runs[per_request - 1]["ts"] + runs[per_request - 1]["dur"]
    return [e for e in events if e.get("ts", 0) > cutoff]


def aggregate(events: list[dict[str, Any]], model: onnx.ModelProto, component: str,
              requests: int = 1) -> dict[str, Any]:
    """Kernel time in µs per request per layer bucket, op type and node, two ways: `*_us` sums the trace over the
    requests and divides (every kernel event lands in exactly one bucket; this is what the wall time pays),
    `*_median_us` takes per node and call position the median over the requests (the calls that ran without
    interference; on a shared machine it can be far lower for small kernels whose weights another process
    evicted from the caches). Also the peak of the bytes the session's allocator held in use (the trace's
    `mem_in_use_peak`)."""
    buckets, order = layer_buckets(model, component)
    per_node: dict[str, dict[str, Any]] = {}
    durations: dict[str, list[float]] = defaultdict(list)
    previous = order[0]
    for e in kernel_events(events):
        node = e["name"][:-len(KERNEL)]
        previous = buckets.get(node) or buckets.get(node.split("/")[0]) or previous
        entry = per_node.setdefault(node, {"op": e["args"]["op_name"], "layer": previous, "us": 0.0, "calls": 0})
        entry["us"] += e["dur"] / requests
        entry["calls"] += 1
        durations[node].append(e["dur"])
    for node, entry in per_node.items():
        entry["median_us"] = _median_per_request(durations[node], requests)
    ran = {n.split("/")[0] for n in per_node}
    peak = max((int(e["args"].get("mem_in_use_peak", 0)) for e in kernel_events(events)), default=0)
    return {
        "arena_peak_bytes": peak,
        "total_us": float(sum(entry["us"] for entry in per_node.values())),
        "per_layer_us": _summed(per_node, "layer", "us", order),
        "per_layer_median_us": _summed(per_node, "layer", "median_us", order),
        "per_op_us": _summed(per_node, "op", "us"),
        "per_op_median_us": _summed(per_node, "op", "median_us"),
        "per_node": per_node,
        "graph_nodes": len(buckets),
        "graph_nodes_run": sum(1 for n in buckets if n in ran),
        "ort_nodes": len(per_node),
    }


def _median_per_request(durations: list[float], requests: int) -> float:
    """Calls arranged [request, call position]: the median over requests, summed over positions."""
    if len(durations) % requests:
        return sum(durations) / requests
    return float(np.median(np.reshape(durations, (requests, -1)), axis=0).sum())


def _summed(per_node: dict[str, dict[str, Any]], key: str, value: str, order: list[str] | None = None) -> dict:
    out: dict[str, float] = defaultdict(float)
    for entry in per_node.values():
        out[entry[key]] += entry[value]
    if order is not None:
        return {k: out[k] for k in order if k in out}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def kernel_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith(KERNEL)]


def chrome_trace(traces: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One Chrome trace (Perfetto, chrome://tracing) with a process per component."""
    out = []
    for pid, (name, agg) in enumerate(traces.items(), start=1):
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
        out.extend({**e, "pid": pid} for e in agg["events"])
    return {"traceEvents": out, "displayTimeUnit": "ms"}
