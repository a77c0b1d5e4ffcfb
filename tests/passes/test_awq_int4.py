"""awq_int4 on zoo:tiny-llava. Its weights are random, so these tests check mechanics and exactness; the quality
claims on real weights (dino-smollm) are measured by scripts/bench_awq.py.

- The bundle's ONNX Runtime logits equal those of the PyTorch model holding the same integer weights and scales,
  dequantized (read back from the graph with unpackers written from the op's documentation), at accuracy level 0,
  for both lowerings.
- AWQ's search error is at most RTN's in every group (that folding scales changes no output is tested in
  tests/quant/test_quantize.py).
- TensorRT's form keeps its INT4 DequantizeLinear through graph_cleanup and cast_precision.
- The TensorRT-LLM checkpoint, read with json + a hand-written safetensors parser and run as a numpy LLaMA, gives the
  ONNX path's logits; the TensorRT form is mixed (linears kept in fp16, int8 embedding rows), so the checkpoint's
  float modules are read the way TensorRT-LLM reads them: by its quantization config's exclude_modules.
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from pydantic import ValidationError

from builders import (checkpoint_linear, excluded_module, fake_quantized, float16_weights, numpy_llama_logits,
                      read_checkpoint, read_safetensors, unpack_int4)
from conftest import ROOT, compile_to
from mmtrt.backends.onnxruntime_backend import session_options
from mmtrt.ir.graph import Component, ModelIR, graph_io
from mmtrt.ir.rewrite import attr
from passes.cleanup.graph_cleanup import GraphCleanup
from passes.precision.cast_precision import CastPrecision
from passes.quant.awq_int4 import AwqInt4Config

CALIBRATION = "calibration: {samples: 4, text_windows: 1, search_tokens: 256}"
ENVELOPE = "envelope: {batch: {min: 1, opt: 1, max: 2}, prompt_tokens: {min: 1, opt: 16, max: 64}, max_new_tokens: 8}\n"
NBITS_RECIPE = f"""model: {{source: zoo, name: tiny-llava}}
passes:
  - dead_layer_elimination: {{}}
  - awq_int4: {{components: [llm, vision], lowering: matmulnbits, accuracy_level: 0, {CALIBRATION}}}
partition: {{llm: [onnxruntime], vision: [onnxruntime]}}
{ENVELOPE}"""
TENSORRT_RECIPE = f"""model: {{source: zoo, name: tiny-llava}}
passes:
  - dead_layer_elimination: {{}}
  - awq_int4: {{group_size: 64, trtllm_dtype: float16, float_budget_mib: 0.05, float_dtype: float16, embedding: int8,
                {CALIBRATION}}}
  - graph_cleanup: {{}}
partition: {{llm: [tensorrt-llm, tensorrt, onnxruntime]}}
{ENVELOPE}"""
LLM_LINEARS = 4 * 7 + 1


@pytest.fixture(scope="module")
def nbits_bundle(tmp_path_factory):
    return compile_to(tmp_path_factory.mktemp("awq_nbits"), NBITS_RECIPE)


@pytest.fixture(scope="module")
def tensorrt_bundle(tmp_path_factory):
    return compile_to(tmp_path_factory.mktemp("awq_trt"), TENSORRT_RECIPE)


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def _report(bundle):
    return next(p for p in _manifest(bundle)["passes"] if p["pass"] == "awq_int4")["changes"]


def _llm_session(bundle):
    opts = session_options(None, spin=False, exact_int4=True)
    return ort.InferenceSession(str(bundle / "llm.onnx"), opts, providers=["CPUExecutionProvider"])


def _llm_feeds(embeds, tiny):
    cfg = tiny[0].config.text_config
    seq = embeds.shape[1]
    feeds = {"inputs_embeds": embeds, "attention_mask": np.ones((1, seq), np.int64),
             "position_ids": np.arange(seq, dtype=np.int64)[None], "logits_from": np.zeros(1, np.int64)}
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    for i in range(cfg.num_hidden_layers):
        for kind in ("key", "value"):
            feeds[f"past.{i}.{kind}"] = np.zeros((1, cfg.num_key_value_heads, 0, head_dim), np.float32)
    return feeds


def _torch_logits(model, embeds):
    with torch.no_grad():
        hidden = model.model.language_model(inputs_embeds=torch.from_numpy(embeds)).last_hidden_state
        return model.lm_head(hidden).numpy()


@pytest.mark.parametrize("which", ["nbits", "tensorrt"])
def test_ort_equals_fake_quantized_torch(request, tiny, rng, which):
    bundle = request.getfixturevalue(f"{which}_bundle")
    model = onnx.load(bundle / "llm.onnx")
    ops = {n.op_type for n in model.graph.node}
    assert ("MatMulNBits" in ops) == (which == "nbits") and ("DequantizeLinear" in ops) == (which == "tensorrt")
    if which == "nbits":
        assert {attr(n, "accuracy_level") for n in model.graph.node if n.op_type == "MatMulNBits"} == {0}
    embeds = rng.normal(size=(1, 11, tiny[0].config.text_config.hidden_size)).astype(np.float32)
    got = _llm_session(bundle).run(["logits"], _llm_feeds(embeds, tiny))[0]
    expected = _torch_logits(fake_quantized(tiny[0], model, LLM_LINEARS), embeds)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_awq_error_at_most_rtn_in_every_group(nbits_bundle):
    changes = _report(nbits_bundle)
    for component, count in (("llm", LLM_LINEARS), ("vision", 3 * 6 + 2)):
        report = changes[component]
        assert report["linears_quantized"] == count and report["lowering"] == "matmulnbits"
        for g in report["groups"]:
            assert g["final_rel_mse"] <= g["scaled_rel_mse"] <= g["rtn_rel_mse"], g
        assert report["final_rel_mse_mean"] < report["rtn_rel_mse_mean"]
        assert any(g["alpha"] > 0 for g in report["groups"])
    assert sum(n.op_type == "MatMulNBits" for n in onnx.load(nbits_bundle / "vision.onnx").graph.node) == 20
    qkv = next(g for g in changes["llm"]["groups"] if g["group"] == "llm.layers.0.q_proj+k_proj+v_proj")
    assert qkv["loss_at"] == "module"
    assert changes["trtllm_checkpoint"]["written"] is False


def _int4_dq_count(model):
    inits = {t.name: t for t in model.graph.initializer}
    return sum(n.op_type == "DequantizeLinear" and inits[n.input[0]].data_type == onnx.TensorProto.INT4
               for n in model.graph.node)


def test_dequantize_linear_survives_later_passes(tensorrt_bundle):
    """graph_cleanup ran after awq_int4 in the recipe; cast_precision runs here on the bundle's graphs."""
    report = _report(tensorrt_bundle)["llm"]
    assert report["lowering"] == "dequantize_linear" and "offers tensorrt" in report["lowering_reason"]
    comps = {}
    for name in ("vision", "embed", "llm"):
        model = onnx.load(tensorrt_bundle / f"{name}.onnx")
        comps[name] = Component(name, graph_io(model, "inputs"), graph_io(model, "outputs"), onnx=model,
                                metadata={"placement": {"targeted": True, "min_segment_size": 5}})
    ir = ModelIR(comps, {}, {})
    quantized = LLM_LINEARS - len(report["kept_float"])
    assert _int4_dq_count(ir.components["llm"].onnx) == quantized
    GraphCleanup(GraphCleanup.Config()).run(ir)
    changes = CastPrecision(CastPrecision.Config()).run(ir)
    assert changes["llm"]["nodes_lowered"] > 0
    assert _int4_dq_count(ir.components["llm"].onnx) == quantized


def _numpy_llama(folder, ids):
    """A LLaMA forward pass from the checkpoint alone: W4A16_AWQ modules in their layout, the modules
    exclude_modules names as float [out, in] (builders.checkpoint_linear)."""
    cfg, t = read_checkpoint(folder)
    return numpy_llama_logits(cfg, t, ids, checkpoint_linear(cfg, t))


MODULES = {"q_proj": "attention.qkv", "k_proj": "attention.qkv", "v_proj": "attention.qkv", "o_proj": "attention.dense",
           "gate_proj": "mlp.fc", "up_proj": "mlp.gate", "down_proj": "mlp.proj"}


def test_mixed_checkpoint_names_its_float_modules_as_tensorrt_llm_reads_them(tensorrt_bundle):
    """The linears awq_int4 kept in fp16 are float modules of the checkpoint, listed in exclude_modules beside
    TensorRT-LLM's own defaults; q, k, v share one module, and fc goes float with gate (fuse_gate_mlp)."""
    kept = _report(tensorrt_bundle)["llm"]["kept_float"]
    assert kept  # the budget keeps some linears in fp16
    folder = tensorrt_bundle / "trtllm" / "checkpoint"
    config = json.loads((folder / "config.json").read_text())
    tensors, dtypes = read_safetensors(folder / "rank0.safetensors")
    excluded = config["quantization"]["exclude_modules"]
    assert {"*lm_head", "*vocab_embedding"} <= set(excluded)
    float_modules = {f"transformer.layers.{n.split('.')[2]}.{MODULES[n.split('.')[3]]}" for n in kept}
    for module in list(float_modules):
        if module.endswith(("mlp.fc", "mlp.gate")):
            float_modules |= {module.rsplit(".", 1)[0] + ".fc", module.rsplit(".", 1)[0] + ".gate"}
    linears = {k.removesuffix(".weight") for k in tensors if k.startswith("transformer.layers.") and
               k.removesuffix(".weight").endswith(tuple(set(MODULES.values())))}
    assert {m for m in linears if excluded_module(config, m)} == float_modules
    for module in linears:
        if module in float_modules:
            assert dtypes[f"{module}.weight"] == "F16" and f"{module}.weights_scaling_factor" not in tensors
        else:
            assert dtypes[f"{module}.weight"] == "I8" and f"{module}.prequant_scaling_factor" in tensors
    assert _report(tensorrt_bundle)["trtllm_checkpoint"]["float_modules"].keys() == float_modules


def test_trtllm_dtype_float32_is_refused_at_plan_time():
    with pytest.raises(ValueError, match="W4A16 kernels take float16 or bfloat16"):
        AwqInt4Config(trtllm_dtype="float32")


def _dequantize_as_the_checkpoint(model: onnx.ModelProto, linears: set[str]) -> None:
    """The INT4 linears whose TensorRT-LLM module is float (a member was kept in float) as the checkpoint holds them:
    the dequantized weight times the pre-quant scale, rounded to float16."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        dq = producer.get(node.input[1]) if node.op_type == "MatMul" and node.name in linears else None
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        scales = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32)
        w = unpack_int4(inits[dq.input[0]]).astype(np.float32) * np.repeat(scales, attr(dq, "block_size"), axis=0)
        mul = producer.get(node.input[0])
        if mul is not None and mul.op_type == "Mul" and mul.input[1] in inits:
            w, node.input[0] = numpy_helper.to_array(inits[mul.input[1]])[:, None] * w, mul.input[0]
        graph.initializer.append(numpy_helper.from_array(w.astype(np.float16).astype(np.float32), f"{node.name}.float"))
        node.input[1] = f"{node.name}.float"


def test_trtllm_checkpoint_reproduces_onnx_logits(tensorrt_bundle, tiny, rng, tmp_path):
    manifest = _manifest(tensorrt_bundle)
    folder = tensorrt_bundle / "trtllm" / "checkpoint"
    assert _report(tensorrt_bundle)["trtllm_checkpoint"]["written"] is True
    assert {"trtllm/checkpoint/config.json", "trtllm/checkpoint/rank0.safetensors"} <= set(manifest["artifacts"])
    plan = manifest["tensorrt_llm"]
    assert plan["checkpoint"] == "trtllm/checkpoint"
    assert plan["command"].startswith("trtllm-build --checkpoint_dir BUNDLE/trtllm/checkpoint")
    config = json.loads((folder / "config.json").read_text())
    assert {k: v for k, v in config["quantization"].items() if k != "exclude_modules"} == {
        "quant_algo": "W4A16_AWQ", "group_size": 64, "has_zero_point": False, "pre_quant_scale": True}
    text = tiny[0].config.text_config
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (
        text.num_hidden_layers, text.hidden_size, text.intermediate_size)
    assert config["rotary_base"] == text.rope_parameters["rope_theta"]

    # the embedding: the embed graph's rows (int8 rows times their scales) in the checkpoint's float16
    table = read_safetensors(folder / "rank0.safetensors")[0]["transformer.vocab_embedding.weight"]
    embed = ort.InferenceSession(str(tensorrt_bundle / "embed.onnx"), providers=["CPUExecutionProvider"])
    rows = embed.run(None, {"input_ids": np.arange(len(table))[None]})[0][0]
    np.testing.assert_array_equal(table, rows.astype(np.float16))

    ids = rng.integers(0, 256, size=13)
    model = onnx.load(tensorrt_bundle / "llm.onnx")
    float_units = {m for m in config["quantization"]["exclude_modules"] if m.startswith("transformer.layers.")}
    _dequantize_as_the_checkpoint(model, {f"llm.layers.{m.split('.')[2]}.{role}" for m in float_units
                                          for role, module in MODULES.items() if m.endswith(module)})
    onnx.save(model, tmp_path / "llm.onnx")
    llm = ort.InferenceSession(float16_weights(tmp_path / "llm.onnx"),
                               session_options(None, spin=False, exact_int4=True), providers=["CPUExecutionProvider"])
    onnx_logits = llm.run(["logits"], _llm_feeds(table[ids][None].astype(np.float32), tiny))[0][0]
    np.testing.assert_allclose(_numpy_llama(folder, ids), onnx_logits, rtol=1e-4, atol=1e-4 * np.abs(onnx_logits).max())


@pytest.mark.parametrize("config,message", [
    ({"symmetric": False, "lowering": "dequantize_linear"}, "symmetric INT4 only"),
    ({"symmetric": False, "trtllm_checkpoint": "always"}, "symmetric INT4 only"),
    ({"group_size": 96}, "power of two"),
    ({"group_size": 8}, "power of two"),
    ({"components": ["llm", "vision"], "calibration": {"images": "none"}}, "needs calibration images"),
    ({"calibration": {"samples": 0, "text_windows": 0}}, "no data"),
    ({"group": 128}, "Extra inputs"),
])
def test_config_rejects(config, message):
    with pytest.raises(ValidationError, match=message):
        AwqInt4Config.model_validate(config)


@pytest.mark.parametrize("group", [32, 256])
def test_plan_rejects_a_group_tensorrt_llm_kernels_do_not_take(tmp_path, group):
    """TensorRT-LLM's INT4 kernels take groups of 64 and 128 only: `always` with another group fails at plan time."""
    from mmtrt.compiler import make_plan
    from mmtrt.errors import UserError

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: {source: zoo, name: tiny-llava}\n"
                      f"passes:\n  - awq_int4: {{group_size: {group}, trtllm_checkpoint: always}}\n")
    with pytest.raises(UserError, match=r"passes\[0\].awq_int4.*group_size 64 or 128"):
        make_plan(recipe)


def test_example_recipe_validates():
    from mmtrt.recipe import load_recipe

    recipe, _ = load_recipe(ROOT / "recipes" / "dino-smollm-int4.yaml")
    config = AwqInt4Config.model_validate(dict(recipe.pass_list())["awq_int4"])
    assert (config.group_size, config.symmetric, config.zero_point) == (32, False, "float")
