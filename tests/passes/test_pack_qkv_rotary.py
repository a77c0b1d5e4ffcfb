"""pack_qkv_rotary on zoo:tiny-llava's static-layout LLM: GroupQueryAttention on the packed projection with its own
rotary gives the logits and cache rows of the graph before the pass (ONNX Runtime, fresh random inputs and cache
contents) for a first prompt, a prompt after a cached prefix and a decode step of two rows at different lengths."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from builders import static_llm_feeds
from mmtrt.ir.graph import Component, ModelIR, graph_io
from passes.fusion.fuse_projections import FuseProjections
from passes.kv.kv_layout import KvLayout
from passes.kv.pack_qkv_rotary import PackQkvRotary

CAPACITY = 24


@pytest.fixture(scope="module")
def graphs(tiny_bundle):
    config = json.loads((tiny_bundle / "manifest.json").read_text())["model"]
    model = onnx.load(tiny_bundle / "llm.onnx")
    comp = Component("llm", graph_io(model, "inputs"), graph_io(model, "outputs"), onnx=model)
    ir = ModelIR({"llm": comp}, config, {})
    KvLayout(KvLayout.Config(layout="static")).run(ir)
    FuseProjections(FuseProjections.Config()).run(ir)
    before = onnx.ModelProto.FromString(comp.onnx.SerializeToString())
    report = PackQkvRotary(PackQkvRotary.Config()).run(ir)["llm"]
    return before, comp.onnx, report, config["llm"]


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def test_every_layer_attends_on_the_packed_projection(graphs):
    _, packed, report, llm = graphs
    assert report["layers_packed"] == llm["num_layers"]
    ops = [n.op_type for n in packed.graph.node]
    assert "RotaryEmbedding" not in ops and ops.count("Split") == llm["num_layers"]  # only the MLPs' gate/up
    gqa = [n for n in packed.graph.node if n.op_type == "GroupQueryAttention"]
    assert all(list(n.input[1:3]) == ["", ""] and len(n.input) == 9 for n in gqa)


@pytest.mark.parametrize("lengths,seq", [([0], 7), ([4], 6), ([5, 9], 1)],
                         ids=["first-prompt", "after-prefix", "decode-two-rows"])
def test_packed_rotary_attention_computes_the_unpacked_outputs(graphs, rng, lengths, seq):
    before, packed, _, llm = graphs
    feeds = static_llm_feeds(rng, llm, lengths, seq, CAPACITY)
    ours, ref = _run(packed, feeds), _run(before, feeds)
    assert ours.keys() == ref.keys()
    for name, value in ref.items():
        rows = slice(None) if name == "logits" else slice(0, int(max(lengths)) + seq)
        ours_v = ours[name] if name == "logits" else ours[name][:, :, rows]
        np.testing.assert_allclose(ours_v, value if name == "logits" else value[:, :, rows], rtol=1e-4, atol=1e-5,
                                   err_msg=name)
