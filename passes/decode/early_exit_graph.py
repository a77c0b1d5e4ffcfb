"""The early-exit draft cut from the LLM's own graph: its first K decoder layers, then its final norm and lm_head.

A decoder layer of the exported LLM holds two RMS norms (before attention, before the MLP) and the model one more
before the lm_head, so in graph order norm 2K reads the residual stream after K layers. The cut feeds that tensor
to the final norm; layers K.. are then dead, and their cache inputs and outputs go (what still reads a later
layer's cache, such as the exporter's shape arithmetic for the mask, reads layer 0's, of the same shape). The draft's
weights are the LLM's bytes, so the bundle writer points them at the LLM's external data (no copy).

Its first K layers compute exactly the full model's keys and values there, so the draft needs no cache of its
own beyond the drafted tokens: the runtime feeds it the full model's cache of those layers. An exit adapter, when
trained, sits between the K-th layer's output and the final norm (exit_adapter.py); its weights are the draft's own.
"""

from __future__ import annotations

import re

import numpy as np
import onnx

from mmtrt.errors import UserError
from mmtrt.ir.graph import Component
from mmtrt.ir.logits import without_logits_from
from mmtrt.ir.rewrite import cleanup, replace_uses
from passes.decode.exit_adapter import attach

NORMS = ("RMSNormalization", "SimplifiedLayerNormalization")
CACHE = re.compile(r"(past|present)\.(\d+)\.(key|value)$")
UNTARGETED = {"targeted": False, "min_segment_size": 1, "backends": ["onnxruntime"]}


def rms_norms(model: onnx.ModelProto, num_layers: int) -> list[onnx.NodeProto]:
    """The graph's RMS norms in order: two per decoder layer, then the final one."""
    norms = [n for n in model.graph.node if n.op_type in NORMS]
    if len(norms) != 2 * num_layers + 1:
        raise UserError(f"speculative early_exit: the LLM graph has {len(norms)} RMS norms where {num_layers} "
                        f"decoder layers give {2 * num_layers + 1} (a fusion rewrote them); put speculative before "
                        "fuse_skip_norm and kv_layout")
    return norms


def cut_early_exit(llm: Component, num_layers: int, keep: int, name: str = "draft",
                   adapter: tuple[np.ndarray, np.ndarray] | None = None) -> Component:
    """A component running the first `keep` of `num_layers` decoder layers of `llm` (hf cache layout); `adapter`
    (weight, bias): the exit adapter between them and the final norm (exit_adapter.py)."""
    if not 1 <= keep < num_layers:
        raise UserError(f"speculative: layers {keep} must be 1..{num_layers - 1} (the LLM has {num_layers} decoder "
                        "layers); pick fewer layers")
    model = onnx.ModelProto()
    model.CopyFrom(llm.onnx)
    graph = model.graph
    norms = rms_norms(model, num_layers)
    if adapter is None:
        norms[-1].input[0] = norms[2 * keep].input[0]
    else:
        attach(model, norms[2 * keep].input[0], norms[-1], *adapter)
    without_logits_from(graph)  # one token per call: the draft's lm_head reads it whole
    for value in graph.input:  # shape arithmetic may read any layer's cache; every layer's has layer 0's shape
        if _later_layer(value.name, keep):
            replace_uses(graph, value.name, CACHE.sub(r"past.0.\3", value.name))
    kept = [o for o in graph.output if not _later_layer(o.name, keep)]
    del graph.output[:]
    graph.output.extend(kept)
    model = cleanup(model)
    inputs = [i for i in model.graph.input if not _later_layer(i.name, keep)]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    # placed as the LLM is: TensorRT segments where the recipe plans the LLM on TensorRT
    draft = Component(name, [], [], metadata={"placement": dict(llm.metadata.get("placement", UNTARGETED))})
    draft.set_graph(model)
    return draft


def _later_layer(tensor: str, keep: int) -> bool:
    match = CACHE.match(tensor)
    return bool(match) and int(match.group(2)) >= keep
