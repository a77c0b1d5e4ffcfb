"""Tiny inputs and graphs built by hand, shared by the tests."""

import copy
import fnmatch
import json
import struct
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from mmtrt.backends.int8_gemm import exact_products, graph_ops
from mmtrt.backends.onnxruntime_backend import session_options
from mmtrt.ir.rewrite import attr
from mmtrt.zoo import tiny_anyres
from mmtrt.zoo.tiny_llava import build_tiny_llava
from mmtrt.zoo.tiny_qwen2_vl import build_tiny_qwen2_vl

TINY_FAMILIES = {  # every model family's tiny model: name -> () -> (model, processor)
    "llava": build_tiny_llava,
    "llava_next": tiny_anyres.build_tiny_llava_next,
    "llava_onevision": tiny_anyres.build_tiny_llava_onevision,
    "qwen2_vl": lambda: build_tiny_qwen2_vl("qwen2_vl"),
    "qwen2_5_vl": lambda: build_tiny_qwen2_vl("qwen2_5_vl"),
}


def random_image(rng: np.random.Generator, height: int, width: int) -> Image.Image:
    """Noise over a smooth gradient: neither constant nor pure noise."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width, y / height, (x + y) / (width + height)], -1) * 200
    noise = rng.normal(0, 25, (height, width, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 23) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def tensor(name: str, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


# Independent readers of the INT4 layouts, written from each format's documentation (never from mmtrt's packers).
SAFETENSORS_TYPES = {"I8": np.int8, "F16": np.float16, "F32": np.float32, "BF16": np.uint16}


def signed_nibbles(nibbles):
    return np.where(nibbles >= 8, nibbles.astype(np.int16) - 16, nibbles)


def unpack_matmulnbits(inits, n, k, block):
    """B [N, ceil(K/block), block/2] uint8, low nibble first along K; scales [N * blocks]; zero points packed two per
    byte per row, low nibble first, 8 when absent (com.microsoft.MatMulNBits)."""
    blocks = -(-k // block)
    b = inits["B"]
    assert b.dtype == np.uint8 and b.shape == (n, blocks, block // 2)
    nibbles = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(n, blocks * block)[:, :k]
    scales = inits["scales"]
    assert scales.shape == (n * blocks,)
    if "zero_points" not in inits:
        return nibbles.astype(np.int16) - 8, scales.reshape(n, blocks), None
    zp = inits["zero_points"]
    assert zp.dtype == np.uint8 and zp.shape == (n * -(-blocks // 2),)
    zp = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)[:, :blocks]
    return nibbles, scales.reshape(n, blocks), zp


def unpack_int4(t: onnx.TensorProto) -> np.ndarray:
    """ONNX INT4: raw_data holds the row-major elements two per byte, the first in the low nibble, padded at the end."""
    assert t.data_type == TensorProto.INT4
    raw = np.frombuffer(t.raw_data, np.uint8)
    count = int(np.prod(t.dims))
    assert raw.size == -(-count // 2)
    return signed_nibbles(np.stack([raw & 0x0F, raw >> 4], axis=-1).reshape(-1)[:count]).reshape(tuple(t.dims))


def read_safetensors(path):
    """8-byte little-endian header length, a JSON header of dtype/shape/offsets, then the data; BF16 to float32."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8:8 + size]), raw[8 + size:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        a = np.frombuffer(data[start:end], SAFETENSORS_TYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = (a.astype(np.uint32) << 16).view(np.float32) if info["dtype"] == "BF16" else a.astype(a.dtype)
    return out, {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


def unpack_int4_rows(packed):
    """int8 [out/2, in]: byte (j, i) holds row 2j in its low nibble and row 2j+1 in its high nibble, signed int4."""
    b = packed.view(np.uint8)
    nibbles = np.stack([b & 0x0F, b >> 4], axis=1).reshape(2 * b.shape[0], b.shape[1]).astype(np.int16)
    return np.where(nibbles >= 8, nibbles - 16, nibbles)


def float16_weights(path):
    """The graph with every float weight rounded to float16 as the float16 checkpoint stores them (norm weights,
    INT4 scales, pre-quant scales, the embedding); lm_head, which TensorRT-LLM keeps in float, becomes its
    dequantized weight rounded to float16. Math stays fp32."""
    model = onnx.load(path)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {out: n for n in graph.node for out in n.output}
    head = producer.get(producer["logits"].input[1]) if "logits" in producer else None
    if head is not None and head.op_type == "DequantizeLinear":
        scale = numpy_helper.to_array(inits[head.input[1]])
        weight = unpack_int4(inits[head.input[0]]) * np.repeat(scale, attr(head, "block_size"), axis=attr(head, "axis"))
        graph.node.remove(head)
        logits, prequant = producer["logits"], producer.get(producer["logits"].input[0])
        if prequant is not None and prequant.op_type == "Mul" and prequant.input[1] in inits:
            # the checkpoint folds lm_head's pre-quant scale into its float weight
            weight = numpy_helper.to_array(inits[prequant.input[1]])[:, None] * weight
            logits.input[0] = prequant.input[0]
        graph.initializer.append(numpy_helper.from_array(weight.astype(np.float32), head.output[0]))
    for t in graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and t.name not in _position_constants(graph):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16).astype(np.float32), t.name))
    return model.SerializeToString()


def _position_constants(graph):
    """Constants of the rotary angles (inv_freq): read by nodes downstream of position_ids; not checkpoint tensors."""
    def downstream(start):
        reached = {start}
        for node in graph.node:  # topological order
            if reached & set(node.input):
                reached |= set(node.output)
        return reached

    hidden = downstream("inputs_embeds")
    positions = downstream("position_ids") - hidden
    return {name for node in graph.node if positions & set(node.input) and not hidden & set(node.output)
            for name in node.input}


NEAR_TIE = 1e-3
# Two float16 steps at the tiny models' logit scale (2 to 4): two float16 runs that sum in another order part by
# about one step there (a top-2 margin of 1.4e-3 flipped between the static and the growing cache).
FP16_NEAR_TIE = 2 * float(np.spacing(np.float16(2)))


def assert_same_up_to_near_ties(ours, ref, tie: float = NEAR_TIE):
    """Equal tokens; where they part, the reference run's step was a near tie (kernels may sum in another order)."""
    for step, (a, b) in enumerate(zip(ours.token_ids, ref.token_ids)):
        if a != b:
            assert ref.margins[step] < tie, f"step {step}: {a} != {b} with margin {ref.margins[step]}"
            return
    assert ours.token_ids == ref.token_ids


def hf_inputs(processor, image, prompt: str):
    """transformers' processor on one image and prompt (the chat template's user turn)."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    return processor(images=image, text=processor.apply_chat_template(messages, add_generation_prompt=True),
                     return_tensors="pt")


def hf_prefill_logits(model, processor, image, prompt: str) -> np.ndarray:
    """transformers' logits at every prompt position."""
    with torch.no_grad():
        return model(**hf_inputs(processor, image, prompt)).logits[0].numpy()


def hf_greedy(model, processor, image, prompt: str, tokens: int) -> tuple[list[int], list[int], list[float]]:
    """transformers' processor and greedy `generate` on one image and prompt: the prompt's ids, the new tokens and
    each step's top-2 margin."""
    inputs = hf_inputs(processor, image, prompt)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=tokens, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
    margins = [float(torch.topk(s[0], 2).values.diff().abs()) for s in out.scores]
    return inputs["input_ids"][0].tolist(), out.sequences[0, inputs["input_ids"].shape[1]:].tolist(), margins


def decided_steps(margins: list[float]) -> int:
    """The steps before the first near tie: what a run in another summation order must reproduce."""
    return next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(margins))


def excluded_module(config: dict, module: str) -> bool:
    """TensorRT-LLM's rule (quantization/quantize.py quantize_layers): a module any exclude_modules pattern matches
    (fnmatch) stays in the checkpoint's float dtype; without a list, its defaults (lm_head, embeddings) do."""
    patterns = config["quantization"].get("exclude_modules") or ["*lm_head", "*vocab_embedding"]
    return any(fnmatch.fnmatchcase(module, p) for p in patterns)


def read_checkpoint(folder):
    """A TensorRT-LLM checkpoint's config.json and rank0.safetensors, its float tensors as float64."""
    cfg = json.loads((folder / "config.json").read_text())
    t, _ = read_safetensors(folder / "rank0.safetensors")
    return cfg, {k: v.astype(np.float64) if v.dtype != np.int8 else v for k, v in t.items()}


def checkpoint_linear(cfg: dict, t: dict):
    """`linear(prefix, x)` in the checkpoint's layout: a float module's weight [out, in]; a W4A16_AWQ module's int8
    [out/2, in] with rows 2j, 2j+1 in the low and high nibbles, scales [out, in/group], activations times the
    pre-quant scale."""
    quantized = cfg["quantization"]["quant_algo"] == "W4A16_AWQ"

    def linear(p, x):
        if not quantized or excluded_module(cfg, p):
            return x @ t[f"{p}.weight"].T
        group = cfg["quantization"]["group_size"]
        w = unpack_int4_rows(t[f"{p}.weight"]) * np.repeat(t[f"{p}.weights_scaling_factor"], group, axis=1)
        return (x * t[f"{p}.prequant_scaling_factor"]) @ w.T

    return linear


def graph_logits_as_checkpoint(bundle, ids, table, positions) -> np.ndarray:
    """The bundle's LLM graph's logits [n, vocab] on an empty cache, with its weights rounded as the float16
    checkpoint stores them (float16_weights) and the prompt embedded by the checkpoint's table: what a checkpoint
    read back must reproduce. `positions`: the position_ids feed, [1, n] or M-RoPE's [3, 1, n]."""
    llm = json.loads((bundle / "manifest.json").read_text())["model"]["llm"]
    feeds = {"inputs_embeds": table[ids][None].astype(np.float32), "attention_mask": np.ones((1, len(ids)), np.int64),
             "position_ids": positions, "logits_from": np.zeros(1, np.int64),
             **{f"past.{i}.{kind}": np.zeros((1, llm["num_kv_heads"], 0, llm["head_dim"]), np.float32)
                for i in range(llm["num_layers"]) for kind in ("key", "value")}}
    options = session_options(None, spin=False, exact_int4=True)
    session = ort.InferenceSession(float16_weights(bundle / "llm.onnx"), options, providers=["CPUExecutionProvider"])
    return session.run(["logits"], feeds)[0][0]


def numpy_llama_logits(cfg: dict, t: dict, ids, linear, cos_sin=None) -> np.ndarray:
    """A TensorRT-LLM LLaMA or QWen checkpoint's forward pass (its names; GPT-NeoX rotary embedding, grouped-query
    causal attention, SwiGLU with silu(fc) * gate, attention.qkv's bias where the checkpoint has one), `linear(prefix,
    x)` applying one linear in the checkpoint's layout. The rotary angles are positions 0..n-1 times rotary_base's
    frequencies, or the (cos, sin) pair per token and frequency `cos_sin` [n, d/2, 2] an M-RoPE runner passes."""
    heads, kv, d, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_size"], cfg["norm_epsilon"]

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w

    seq = len(ids)
    if cos_sin is None:
        angles = np.arange(seq)[:, None] * cfg["rotary_base"] ** (-np.arange(0, d, 2) / d)[None]
        cos_sin = np.stack([np.cos(angles), np.sin(angles)], -1)
    cos, sin = (np.concatenate([cos_sin[..., i]] * 2, -1) for i in (0, 1))

    def rope(x):  # GPT-NeoX halves, [heads, seq, d]
        return x * cos + np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1) * sin

    x = t["transformer.vocab_embedding.weight"][ids]
    causal = np.triu(np.full((seq, seq), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"transformer.layers.{i}"
        qkv = linear(f"{p}.attention.qkv", rms(x, t[f"{p}.input_layernorm.weight"])) + t.get(
            f"{p}.attention.qkv.bias", 0.0)
        q = rope(qkv[:, : heads * d].reshape(seq, heads, d).transpose(1, 0, 2))
        k = rope(qkv[:, heads * d: (heads + kv) * d].reshape(seq, kv, d).transpose(1, 0, 2))
        v = qkv[:, (heads + kv) * d:].reshape(seq, kv, d).transpose(1, 0, 2)
        k, v = np.repeat(k, heads // kv, axis=0), np.repeat(v, heads // kv, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d) + causal
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        attn = (probs / probs.sum(-1, keepdims=True)) @ v
        x = x + linear(f"{p}.attention.dense", attn.transpose(1, 0, 2).reshape(seq, heads * d))
        h = rms(x, t[f"{p}.post_layernorm.weight"])
        fc = linear(f"{p}.mlp.fc", h)
        x = x + linear(f"{p}.mlp.proj", fc / (1 + np.exp(-fc)) * linear(f"{p}.mlp.gate", h))
    return rms(x, t["transformer.ln_f.weight"]) @ t["lm_head.weight"].T


def declared_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """QWenForCausalLM's parameters for a float checkpoint, tp_size 1 (models/qwen/model.py): Embedding
    [vocab, hidden]; per layer RmsNorm weights, Attention's qkv ColumnLinear [(heads + 2 kv heads) x head, hidden] with
    its bias (attn_bias) and dense RowLinear [hidden, heads x head] without (dense_bias=False), GatedMLP's fc and gate
    [intermediate, hidden] and proj [hidden, intermediate] (mlp_bias False); ln_f; lm_head ColumnLinear
    [vocab padded to tp_size, hidden]."""
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    qkv = (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * cfg["head_size"]
    shapes = {"transformer.vocab_embedding.weight": (v, h), "transformer.ln_f.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"transformer.layers.{i}"
        shapes |= {f"{p}.input_layernorm.weight": (h,), f"{p}.post_layernorm.weight": (h,),
                   f"{p}.attention.qkv.weight": (qkv, h), f"{p}.attention.qkv.bias": (qkv,),
                   f"{p}.attention.dense.weight": (h, cfg["num_attention_heads"] * cfg["head_size"]),
                   f"{p}.mlp.fc.weight": (inter, h), f"{p}.mlp.gate.weight": (inter, h),
                   f"{p}.mlp.proj.weight": (h, inter)}
    return shapes


def w4a16_shapes(shapes: dict, group: int) -> dict[str, tuple[int, ...]]:
    """The same linears in W4A16_AWQ as modelopt exports them for trtllm-build (mmtrt/handoff/trtllm_checkpoint.py):
    weight int8 [out/2, in], weights_scaling_factor [out, in/group], prequant_scaling_factor [in]; biases and the
    float modules (embedding, norms, lm_head) unchanged."""
    out = {}
    for name, shape in shapes.items():
        module = name.removesuffix(".weight")
        if name.startswith("transformer.layers.") and name.endswith(".weight") and len(shape) == 2:
            n, k = shape
            out |= {name: (n // 2, k), f"{module}.weights_scaling_factor": (n, k // group),
                    f"{module}.prequant_scaling_factor": (k,)}
        else:
            out[name] = shape
    return out


def tiny_llm_feeds(rng) -> dict[str, np.ndarray]:
    """Random inputs of zoo:tiny-llava's LLM graph: 7 new positions after 3 cached ones (4 layers, 2 KV heads of 32)."""
    feeds = {"inputs_embeds": rng.normal(size=(1, 7, 128)).astype(np.float32),
             "attention_mask": np.ones((1, 10), np.int64), "position_ids": np.arange(3, 10, dtype=np.int64)[None],
             "logits_from": np.zeros(1, np.int64)}
    for i in range(4):
        for kind in ("key", "value"):
            feeds[f"past.{i}.{kind}"] = rng.normal(size=(1, 2, 3, 32)).astype(np.float32)
    return feeds


def dequantized_linears(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Per linear name, the float weight [N, K] the graph applies to its (pre-quant-scaled) input, and the name of
    that input before any pre-quant Mul; read from MatMulNBits, DequantizeLinear + MatMul, or a kept linear's fp16
    weight cast in front of its MatMul."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    out = {}
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            n, k, block = attr(node, "N"), attr(node, "K"), attr(node, "block_size")
            arrays = {key: numpy_helper.to_array(inits[name]) for key, name in zip(("B", "scales", "zero_points"), node.input[1:])}
            q, scales, zp = unpack_matmulnbits(arrays, n, k, block)  # q signed when there are no zero points
            q = q.astype(np.float32) - (0 if zp is None else np.repeat(zp, block, axis=1)[:, :k])
            w = q * np.repeat(scales, block, axis=1)[:, :k]
            name, x = node.name, node.input[0]
        elif node.op_type == "MatMul" and producer.get(node.input[1], node).op_type == "DequantizeLinear":
            dq = producer[node.input[1]]
            q, scales, block = unpack_int4(inits[dq.input[0]]), numpy_helper.to_array(inits[dq.input[1]]), attr(dq, "block_size")
            w = (q.astype(np.float32) * np.repeat(scales, block, axis=0)[: q.shape[0]]).T
            name, x = node.name, node.input[0]
        elif node.op_type == "MatMul" and node.input[1].endswith(".weight_cast"):  # kept in float, stored in fp16
            stored = producer[node.input[1]].input[0] if node.input[1] in producer else node.input[1]  # or folded
            w = numpy_helper.to_array(inits[stored]).T.astype(np.float32)
            name, x = node.input[1].removesuffix(".weight_cast"), node.input[0]
        else:
            continue
        mul = producer.get(x)
        if mul is not None and mul.op_type == "Mul" and mul.input[1] in inits:
            w, x = w * numpy_helper.to_array(inits[mul.input[1]])[None, :], mul.input[0]
        out[name] = (w, x)
    return out


def fake_quantized(source, model: onnx.ModelProto, linears_expected: int):
    """A copy of the PyTorch LLaVA-style `source` with every LLM linear set to the graph's dequantized weight and
    every RMSNorm to the graph's (scale-folded) weight."""
    ref = copy.deepcopy(source)
    lm = ref.model.language_model
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    linears = {k: v for k, v in dequantized_linears(model).items() if k.startswith("llm.")}
    assert len(linears) == linears_expected, sorted(linears)
    for name, (w, x) in linears.items():
        made = producer[x]
        if made.op_type == "Slice":  # the lm_head reads the final norm's rows from logits_from on
            made = producer[made.input[0]]
        norm = inits[made.input[1]] if made.op_type == "RMSNormalization" else None
        parts = name.split(".")
        if parts[1] == "lm_head":
            module, norm_module = ref.lm_head, lm.norm
        else:
            layer = lm.layers[int(parts[2])]
            block = layer.self_attn if parts[3] in ("q_proj", "k_proj", "v_proj", "o_proj") else layer.mlp
            module = getattr(block, parts[3])
            norm_module = {"q_proj": layer.input_layernorm, "gate_proj": layer.post_attention_layernorm}.get(parts[3])
        module.weight.data = torch.from_numpy(np.ascontiguousarray(w, np.float32))
        if norm is not None and norm_module is not None:
            norm_module.weight.data = torch.from_numpy(norm.copy())
    return ref



def static_llm_feeds(rng, llm: dict, lengths, seq: int, capacity: int) -> dict[str, np.ndarray]:
    """Random inputs of a `kv_layout: static` LLM graph (`llm`: the manifest's model.llm): `seq` new positions
    after each row's `lengths` cached ones, in buffers of `capacity`."""
    lengths = np.array(lengths, np.int64)
    batch = len(lengths)
    feeds = {"inputs_embeds": rng.normal(size=(batch, seq, llm["hidden_size"])).astype(np.float32),
             "position_ids": lengths[:, None] + np.arange(seq, dtype=np.int64),
             "seqlens_k": (lengths + seq - 1).astype(np.int32),
             "total_sequence_length": np.array(lengths.max() + seq, np.int32),
             "logits_from": np.array([0], np.int64)}
    for i in range(llm["num_layers"]):
        for kind in ("key", "value"):
            feeds[f"past.{i}.{kind}"] = rng.normal(
                size=(batch, llm["num_kv_heads"], capacity, llm["head_dim"])).astype(np.float32)
    return feeds

class StaticCacheForm:
    """One static-cache form of an LLM graph with its own buffers, bound in place as past and present and fed as
    mmtrt.runtime.batch.StaticStepper feeds them (one ONNX Runtime thread). `model`: a graph, or a file that ONNX
    Runtime opens itself (its external data resolved as the runtimes resolve it). Its int8 GEMMs are exact, as the
    runtimes' are (mmtrt.backends.int8_gemm)."""

    def __init__(self, model: onnx.ModelProto | Path, llm: dict, capacity: int, batch: int = 1):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        exact_products(options, graph_ops(model) if isinstance(model, Path) else {n.op_type for n in model.graph.node})
        source = str(model) if isinstance(model, Path) else model.SerializeToString()
        self.session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        self.inputs, self.lengths = {i.name for i in self.session.get_inputs()}, np.zeros(batch, np.int64)
        shape = (batch, llm["num_kv_heads"], capacity, llm["head_dim"])
        self.cache = {f"past.{n}.{k}": np.zeros(shape, np.float32) for n in range(llm["num_layers"])
                      for k in ("key", "value")}

    def step(self, embeds: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
        """Logits of every new position; `positions` default to each row's cache indices."""
        seq, io = embeds.shape[1], self.session.io_binding()
        feeds = {"inputs_embeds": embeds,
                 "position_ids": self.lengths[:, None] + np.arange(seq) if positions is None else positions,
                 "seqlens_k": (self.lengths + seq - 1).astype(np.int32),
                 "total_sequence_length": np.array(self.lengths.max() + seq, np.int32),
                 "logits_from": np.array([0], np.int64)}
        for name, value in feeds.items():
            if name in self.inputs:
                io.bind_cpu_input(name, value)
        io.bind_output("logits")  # first: get_outputs() follows the binding order
        for past, buffer in self.cache.items():
            io.bind_input(past, "cpu", 0, np.float32, buffer.shape, buffer.ctypes.data)
            io.bind_output(past.replace("past.", "present."), "cpu", 0, np.float32, buffer.shape, buffer.ctypes.data)
        self.session.run_with_iobinding(io)
        self.lengths += seq
        return io.get_outputs()[0].numpy()


def solo_generation(bundle, request):
    """`request` alone on a fresh load of `bundle`, with no cache that an earlier request could have filled."""
    from mmtrt.runtime import load

    return load(bundle, prefix_cache_mib=0, encoder_cache_mib=0).generate_batch([request])[0]


def assert_admission_kept_solo_tokens(pipe, bundle, requests, sequences, advanced: int, steps_between: int):
    """The running request (first of `requests`, `sequences`) advanced a token per decode step taken during the
    other's admission (unless it ended first), and both kept their solo greedy tokens."""
    reference = solo_generation(bundle, requests[0])
    assert advanced == min(1 + steps_between, len(reference.token_ids))
    assert_same_up_to_near_ties(pipe.generation(sequences[0]), reference)
    assert_same_up_to_near_ties(pipe.generation(sequences[1]), solo_generation(bundle, requests[1]))
