"""Calibration one decoder layer at a time, as llm-awq and AutoAWQ calibrate.

The graph is cut into stages: stage i holds the nodes that the i-th chunk's captured tensors need and no earlier
stage ran. Each stage runs as a graph of its own over every batch, fed by the graph inputs and by what earlier
stages made that it reads (the residual stream, rotary tables, masks), which are kept per batch only while a
later stage reads them. A pass then holds one layer's statistics at a time (AWQ's Gram matrices grow with the
square of a linear's input width: 0.97 GB in float64 for one Llama-2-7B down_proj, 31 GB for its 32 layers) and
one stage's session, while every node still runs once per batch, as in one run of the whole graph.

After each layer the heap's free pages go back to the system (`give_back_freed_memory`): a layer's arrays of a few
MB to glibc's 32 MB mmap threshold come from the heap, which glibc does not shrink by itself, so without it the
resident set grew by about one layer's float32 weights per layer (1 GB for a Llama-2-7B layer).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import onnx
from onnx import helper

from mmtrt.ir.graph import node_inputs
from mmtrt.ir.resident import give_back_freed_memory
from mmtrt.progress import track
from mmtrt.quant.session import session


@dataclass
class Stage:
    """Nodes (positions in the graph, in its order), what they read from the graph inputs or earlier stages, and
    what they make that their chunk captures or a later stage reads."""

    nodes: list[int]
    inputs: list[str]
    outputs: list[str]


def plan_stages(graph: onnx.GraphProto, chunks: list[list[str]], nodes: list[onnx.NodeProto] | None = None
                ) -> list[Stage]:
    """One stage per chunk of tensor names to capture; `nodes` in place of the graph's (the same order)."""
    nodes = graph.node if nodes is None else nodes
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    constants = {t.name for t in graph.initializer}
    owner: dict[int, int] = {}
    for c, names in enumerate(chunks):
        todo = [producer[n] for n in names if n in producer]
        while todo:
            i = todo.pop()
            if i not in owner:
                owner[i] = c
                todo += [producer[n] for n in node_inputs(nodes[i]) if n in producer]
    owned: list[list[int]] = [[] for _ in chunks]
    for i in sorted(owner):
        owned[owner[i]].append(i)
    inputs = []
    for s, chosen in enumerate(owned):
        made = {out for i in chosen for out in nodes[i].output}
        read = [n for i in chosen for n in node_inputs(nodes[i]) if n not in made and n not in constants]
        inputs.append(list(dict.fromkeys(read + [n for n in chunks[s] if n not in made])))
    stages = []
    for s, chosen in enumerate(owned):
        made = [out for i in chosen for out in nodes[i].output if out]
        later = {n for ins in inputs[s + 1:] for n in ins}
        stages.append(Stage(chosen, inputs[s], [n for n in made if n in later or n in chunks[s]]))
    return stages


def captured(model: onnx.ModelProto, chunks: list[list[str]], batches: list[dict[str, np.ndarray]],
             what: str = "calibration", nodes: list[onnx.NodeProto] | None = None
             ) -> Iterator[Iterator[dict[str, np.ndarray]]]:
    """For each chunk, an iterator over the batches of its tensors ({name: array}); each is run out before the
    next chunk's stage starts. `what` names the stages in the progress lines; `nodes` replace the graph's."""
    nodes = list(model.graph.node) if nodes is None else nodes
    stages = plan_stages(model.graph, chunks, nodes)
    cache = [dict(b) for b in batches]
    for s, (stage, names) in enumerate(zip(stages, chunks)):
        later = {n for st in stages[s + 1:] for n in st.inputs}
        runs = _run_stage(model, nodes, stage, names, cache, later, f"{what}, stage {s + 1} of {len(stages)}")
        yield runs
        deque(runs, maxlen=0)


def _run_stage(model: onnx.ModelProto, nodes: list[onnx.NodeProto], stage: Stage, names: list[str],
               cache: list[dict[str, np.ndarray]], later: set[str], desc: str) -> Iterator[dict[str, np.ndarray]]:
    """The stage on each batch: its captures are handed out, and a batch keeps only what later stages read (a
    capture no later stage reads, such as a down projection's wide input, is held one batch at a time), and the
    heap's free pages go back after each batch (a batch's arrays are below glibc's mmap threshold)."""
    sess = session(_stage_model(model, [nodes[i] for i in stage.nodes], stage, cache[0])) if stage.outputs else None
    for values in track(cache, desc, total=len(cache)):
        made = dict(zip(stage.outputs, sess.run(stage.outputs, {n: values[n] for n in stage.inputs}))) if sess else {}
        yield {n: made[n] if n in made else values[n] for n in names}
        values.update((n, v) for n, v in made.items() if n in later)
        for name in [n for n in values if n not in later]:
            del values[name]
        give_back_freed_memory()


def _stage_model(model: onnx.ModelProto, nodes: list[onnx.NodeProto], stage: Stage,
                 example: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The stage's nodes as a model: its inputs typed from the example batch, the initializers its nodes read."""
    used = {n for node in nodes for n in node_inputs(node)}
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(example[n].dtype), None)
              for n in stage.inputs]
    graph = helper.make_graph(nodes, "stage", inputs, [helper.make_empty_tensor_value_info(n) for n in stage.outputs],
                              [t for t in model.graph.initializer if t.name in used])
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version,
                             functions=model.functions)

