"""A calibration session on a graph above `IN_MEMORY_BYTES` (any above protobuf's 2 GB among them): loaded from a
temporary folder with its large initializers as external data, it computes what the graph's own session computes
(the budget lowered so that the tiny LLaVA's graph takes that path), on fresh random inputs, and leaves the graph
as it was."""

import numpy as np
import onnx

from builders import tiny_llm_feeds
from mmtrt.quant import session as sessions


def test_a_graph_over_the_budget_runs_from_external_data(tiny_bundle, rng, monkeypatch, tmp_path):
    model = onnx.load(tiny_bundle / "llm.onnx")
    feeds = tiny_llm_feeds(rng)
    whole = sessions.session(model).run(None, feeds)
    before = model.SerializeToString()
    monkeypatch.setattr(sessions, "IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(sessions, "EXTERNAL_BYTES", 1024)
    path = sessions.save_external(model, tmp_path)
    external = [t for t in onnx.load(path, load_external_data=False).graph.initializer if t.external_data]
    assert len(external) > 20
    for a, b in zip(sessions.session(model).run(None, feeds), whole):
        np.testing.assert_array_equal(a, b)
    assert model.SerializeToString() == before
