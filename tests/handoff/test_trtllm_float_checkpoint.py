"""The float LLM's TensorRT-LLM checkpoint, read back with json + a hand-written safetensors parser (tests/builders)
following TensorRT-LLM's checkpoint format (docs/source/architecture/checkpoint.md: config.json, rank0.safetensors,
linear weights [out_feature, in_feature], `transformer.layers.N.attention.qkv` = q, k, v rows; LLaMA's GatedMLP
computes proj(silu(fc(x)) * gate(x))), run as a numpy LLaMA: its logits are those of ONNX Runtime on the bundle's LLM
with the same float16 weights."""

import json

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from builders import checkpoint_linear, float16_weights, numpy_llama_logits, read_checkpoint, read_safetensors
from conftest import compile_to


def numpy_llama(folder, ids):
    cfg, t = read_checkpoint(folder)
    assert cfg["quantization"]["quant_algo"] is None
    return numpy_llama_logits(cfg, t, ids, checkpoint_linear(cfg, t))


def llm_feeds(bundle, embeds):
    llm = json.loads((bundle / "manifest.json").read_text())["model"]["llm"]
    seq = embeds.shape[1]
    feeds = {"inputs_embeds": embeds, "attention_mask": np.ones((1, seq), np.int64),
             "position_ids": np.arange(seq, dtype=np.int64)[None], "logits_from": np.zeros(1, np.int64)}
    for i in range(llm["num_layers"]):
        for kind in ("key", "value"):
            feeds[f"past.{i}.{kind}"] = np.zeros((1, llm["num_kv_heads"], 0, llm["head_dim"]), np.float32)
    return feeds


def test_float_checkpoint_reproduces_onnx_logits(tiny_trtllm_bundle, rng):
    manifest = json.loads((tiny_trtllm_bundle / "manifest.json").read_text())
    plan = manifest["tensorrt_llm"]
    assert plan["checkpoint"] == "trtllm/checkpoint" and plan["checkpoint_missing"] is None
    assert {"trtllm/checkpoint/config.json", "trtllm/checkpoint/rank0.safetensors"} <= set(manifest["artifacts"])
    folder = tiny_trtllm_bundle / "trtllm" / "checkpoint"
    config = json.loads((folder / "config.json").read_text())
    llm = manifest["model"]["llm"]
    assert config["dtype"] == "float16"  # no cast_precision in this recipe: TensorRT-LLM's 16-bit default
    assert (config["num_hidden_layers"], config["head_size"], config["num_key_value_heads"]) == (
        llm["num_layers"], llm["head_dim"], llm["num_kv_heads"])
    _, dtypes = read_safetensors(folder / "rank0.safetensors")
    assert set(dtypes.values()) == {"F16"}

    ids = rng.integers(0, config["vocab_size"], size=11)
    embed = ort.InferenceSession(float16_weights(tiny_trtllm_bundle / "embed.onnx"), providers=["CPUExecutionProvider"])
    embeds = embed.run(None, {"input_ids": ids[None]})[0]
    session = ort.InferenceSession(float16_weights(tiny_trtllm_bundle / "llm.onnx"), providers=["CPUExecutionProvider"])
    onnx_logits = session.run(["logits"], llm_feeds(tiny_trtllm_bundle, embeds))[0][0]
    np.testing.assert_allclose(numpy_llama(folder, ids), onnx_logits, rtol=1e-4, atol=1e-4 * np.abs(onnx_logits).max())


CAST_RECIPE = """model: {source: zoo, name: tiny-llava}
passes:
  - dead_layer_elimination: {}
  - cast_precision: {dtype: bf16}
partition: {llm: [tensorrt-llm, tensorrt, onnxruntime]}
envelope: {batch: {min: 1, opt: 1, max: 2}, prompt_tokens: {min: 1, opt: 16, max: 64}, max_new_tokens: 8}
"""


def test_cast_precision_checkpoint_holds_the_graph_weights_bit_for_bit(tmp_path):
    """After cast_precision (bf16) the checkpoint is bfloat16 and its linears are the LLM graph's MatMul weights,
    transposed to [out, in] (q, k, v split back out of qkv): those the pass lowered (its TensorRT segments, behind
    Casts) bit for bit, those it kept in fp32 rounded to bfloat16."""
    bundle = compile_to(tmp_path, CAST_RECIPE)
    folder = bundle / "trtllm" / "checkpoint"
    config = json.loads((folder / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    tensors, dtypes = read_safetensors(folder / "rank0.safetensors")
    assert set(dtypes.values()) == {"BF16"}
    heads, kv, d = config["num_attention_heads"], config["num_key_value_heads"], config["head_size"]
    written = []
    for name, w in tensors.items():
        if name.endswith("attention.qkv.weight"):
            written += np.split(w, [heads * d, (heads + kv) * d])
        elif name.endswith(("dense.weight", "mlp.fc.weight", "mlp.gate.weight", "mlp.proj.weight", "lm_head.weight")):
            written.append(w)
    model = onnx.load(bundle / "llm.onnx")
    inits = {t.name: t for t in model.graph.initializer}
    weights = [inits[n.input[1]] for n in model.graph.node
               if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2]
    assert any(w.data_type == onnx.TensorProto.BFLOAT16 for w in weights)
    graph = [numpy_helper.to_array(w).astype(ml_dtypes.bfloat16).astype(np.float32).T for w in weights]
    assert len(graph) == len(written) == 7 * config["num_hidden_layers"] + 1
    key = sorted((w.shape, w.astype(np.float32).tobytes()) for w in written)
    assert key == sorted((w.shape, w.tobytes()) for w in graph)
