"""The token embedding in 8 bits: one scale per row (max|row| / 127, llama.cpp's Q8 practice at row granularity),
gathered beside the int8 rows and applied in the embed graph, so that only the looked-up rows are dequantized.

Gather(table, ids) becomes Gather(q, ids) -> Cast -> Mul by Gather(scales, ids): the same output up to each row's
rounding, a quarter of the fp32 table's bytes (plus 4 bytes a row).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mmtrt.errors import UserError
from mmtrt.ir import source_weights


def quantize_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [V, H] in [-127, 127], scales [V, 1] float32); an all-zero row gets scale 1."""
    amax = np.abs(table.astype(np.float32)).max(axis=1, keepdims=True)
    scales = np.where(amax > 0, amax / 127, 1).astype(np.float32)
    return np.clip(np.rint(table / scales), -127, 127).astype(np.int8), scales


def int8_embedding(model: onnx.ModelProto) -> dict:
    """Rewrite the embed graph's Gather from its constant table in place; returns the report's bytes."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    gathers = [i for i, n in enumerate(graph.node) if n.op_type == "Gather" and n.input[0] in inits]
    if len(gathers) != 1 or len(inits[graph.node[gathers[0]].input[0]].dims) != 2:
        raise UserError("awq_int4 embedding: int8 needs an embed graph that gathers from one constant 2-D table; "
                        "set embedding: float")
    position = gathers[0]
    gather = onnx.NodeProto()
    gather.CopyFrom(graph.node[position])
    table = inits[gather.input[0]]
    values = source_weights.array(table)
    q, scales = quantize_rows(values)
    name, out = table.name, gather.output[0]
    new = [numpy_helper.from_array(q, f"{name}.int8"),
           numpy_helper.from_array(scales.astype(values.dtype), f"{name}.row_scale")]
    nodes = [helper.make_node("Gather", [new[0].name, gather.input[1]], [f"{out}.int8"], name=f"{gather.name}.int8",
                              axis=0),
             helper.make_node("Cast", [f"{out}.int8"], [f"{out}.float"], name=f"{gather.name}.cast",
                              to=table.data_type),
             helper.make_node("Gather", [new[1].name, gather.input[1]], [f"{out}.scale"], name=f"{gather.name}.scale",
                              axis=0),
             helper.make_node("Mul", [f"{out}.float", f"{out}.scale"], [out], name=f"{gather.name}.dequantize")]
    del graph.node[position]
    for offset, node in enumerate(nodes):
        graph.node.insert(position + offset, node)
    del graph.initializer[next(i for i, t in enumerate(graph.initializer) if t.name == name)]
    graph.initializer.extend(new)
    return {"embedding": "int8 per row", "bytes_before": values.nbytes,
            "bytes_after": q.nbytes + scales.astype(values.dtype).nbytes, "rows": int(values.shape[0])}
