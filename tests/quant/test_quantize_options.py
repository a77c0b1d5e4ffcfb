"""awq_int4's newer options on the exported tiny LLaVA: GPTQ rounds each linear as `gptq_quantize` does on the
Hessian of its calibration inputs (taken from the graph independently here) and beats RTN there; mixed precision
keeps exactly the reported linears as float MatMuls, the most sensitive ones within the budget; the int8 embedding
computes numpy's dequantized rows."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from builders import tiny_llm_feeds
from mmtrt.quant.embedding import int8_embedding
from mmtrt.quant.gptq import gptq_quantize
from mmtrt.quant.int4 import Grid
from mmtrt.quant.linears import find_linears
from mmtrt.quant.quantize import Settings, quantize_component


def _settings(**overrides):
    base = dict(method="gptq", grid=Grid(64), clip=False, lowering="matmulnbits", accuracy_level=0,
                search_tokens=64, select=lambda name: True)
    return Settings(**{**base, **overrides})


def _linear_hessians(model, batches):
    """Every linear's X^T X on the batches (summed per batch in float32 as calibration does) and its weight, from
    the float graph with the linears' inputs made outputs."""
    _, linears, _ = find_linears(model, "llm")
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    names = sorted({lin.input for lin in linears})
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = [dict(zip([o.name for o in sess.get_outputs()], sess.run(None, b))) for b in batches]
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    def gram(name, k):
        return sum((x.T @ x).astype(np.float64) for x in (o[name].reshape(-1, k).astype(np.float32) for o in outs))

    return {lin.name: (gram(lin.input, lin.k), weights[lin.weight].T.astype(np.float32)) for lin in linears}


def test_gptq_method_rounds_each_linear_on_its_inputs_hessian(tiny_bundle, rng):
    model = onnx.load(tiny_bundle / "llm.onnx")
    batches = [tiny_llm_feeds(rng), tiny_llm_feeds(rng)]
    inputs = _linear_hessians(model, batches)
    quantized, report = quantize_component(model, "llm", batches, _settings())
    assert len(quantized) == len(inputs)
    for ql in quantized:
        hessian, w = inputs[ql.linear.name]
        q, scales, _ = gptq_quantize(w, hessian, Grid(64))
        np.testing.assert_array_equal(ql.q, q, err_msg=ql.linear.name)
        np.testing.assert_array_equal(ql.scales, scales, err_msg=ql.linear.name)
    errors = report["own_output_rel_mse"]
    assert sum(e["final"] < e["rtn"] for e in errors.values()) >= 0.9 * len(errors)


def test_mixed_precision_keeps_exactly_the_reported_linears_in_float(tiny_bundle, rng):
    model = onnx.load(tiny_bundle / "llm.onnx")
    linears = {lin.name: lin for lin in find_linears(model, "llm")[1]}
    budget = 40_000
    quantized, report = quantize_component(model, "llm", [tiny_llm_feeds(rng)], _settings(method="rtn", float_budget=budget))
    kept = set(report["kept_float"])
    assert kept and len(kept) + len(quantized) == len(linears)
    assert {ql.linear.name for ql in quantized}.isdisjoint(kept)
    producer = {n.output[0]: n for n in model.graph.node}
    inits = {t.name for t in model.graph.initializer}
    for name, lin in linears.items():
        node = producer[lin.output]
        is_float = node.op_type == "MatMul" and node.input[1] in inits
        assert is_float == (name in kept), name
        assert (node.op_type == "MatMulNBits") == (name not in kept), name
    # the budget's rule: most sensitive first, each while it fits; a float linear adds K N 4 bytes less its INT4 form
    # (packed nibbles and one fp32 scale per group of 64)
    errors = report["own_output_rel_mse"]
    expected, spent = set(), 0
    for name in sorted(errors, key=lambda n: -errors[n]["final"]):
        lin = linears[name]
        groups = -(-lin.k // 64)
        extra = lin.k * lin.n * 4 - lin.n * groups * (32 + 4)
        if spent + extra <= budget:
            expected.add(name)
            spent += extra
    assert kept == expected


def test_fp16_storage_keeps_the_float_weights_rounded_to_fp16_under_the_halved_cost(tiny_bundle, rng):
    """float_dtype float16: a kept linear reads Cast(its weight in fp16), the budget counts 2 bytes a weight, and
    the graph computes what numpy computes with the fp32 graph's kept weights rounded to fp16."""
    feeds = tiny_llm_feeds(rng)
    budget = 40_000
    as_fp32, as_fp16 = onnx.load(tiny_bundle / "llm.onnx"), onnx.load(tiny_bundle / "llm.onnx")
    linears = {lin.name: lin for lin in find_linears(as_fp16, "llm")[1]}
    _, report = quantize_component(as_fp16, "llm", [feeds], _settings(method="rtn", float_budget=budget,
                                                                      float_dtype="float16"))
    kept = set(report["kept_float"])
    errors = report["own_output_rel_mse"]
    expected, spent = set(), 0
    for name in sorted(errors, key=lambda n: -errors[n]["final"]):
        lin = linears[name]
        extra = lin.k * lin.n * 2 - lin.n * -(-lin.k // 64) * (32 + 4)
        if spent + extra <= budget:
            expected.add(name)
            spent += extra
    assert kept == expected and len(kept) > len(quantize_component(
        as_fp32, "llm", [feeds], _settings(method="rtn", float_budget=budget))[1]["kept_float"])
    producer = {n.output[0]: n for n in as_fp16.graph.node}
    inits = {t.name: t for t in as_fp16.graph.initializer}
    for name in kept:
        cast = producer[producer[linears[name].output].input[1]]
        assert cast.op_type == "Cast" and inits[cast.input[0]].data_type == onnx.TensorProto.FLOAT16, name
    original = {lin.name: numpy_helper.to_array(t) for t in onnx.load(tiny_bundle / "llm.onnx").graph.initializer
                for lin in linears.values() if t.name == lin.weight}
    for name in kept:  # rtn: no scale folded, so the stored weight is the exported one rounded to fp16
        cast = producer[producer[linears[name].output].input[1]]
        np.testing.assert_array_equal(numpy_helper.to_array(inits[cast.input[0]]), original[name].astype(np.float16))
    session = ort.InferenceSession(as_fp16.SerializeToString(), providers=["CPUExecutionProvider"])
    assert np.isfinite(session.run(None, feeds)[0]).all()


def test_int8_embedding_runs_numpys_dequantized_rows(tiny_bundle, rng):
    model = onnx.load(tiny_bundle / "embed.onnx")
    table = next(numpy_helper.to_array(t) for t in model.graph.initializer if len(t.dims) == 2)
    report = int8_embedding(model)
    ids = rng.integers(0, table.shape[0], size=(2, 9)).astype(np.int64)
    out = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {model.graph.input[0].name: ids})[0]
    scale = np.abs(table).max(axis=1, keepdims=True) / 127
    expected = (np.clip(np.rint(table / scale), -127, 127) * scale)[ids]
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)
    assert np.all(np.abs(out - table[ids]) <= scale[ids] / 2 * (1 + 1e-5))
    assert (report["bytes_before"], report["bytes_after"]) == (4 * table.size, table.size + 4 * table.shape[0])


def test_int8_embedding_refuses_a_graph_without_one_table():
    from mmtrt.errors import UserError

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.INT64, [2])])
    with pytest.raises(UserError, match="embedding: float"):
        int8_embedding(helper.make_model(graph))
