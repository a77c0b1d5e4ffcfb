"""Small vision graphs and helpers shared by the token_prune tests."""

import copy

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from builders import make_model, tensor
from mmtrt.ir.graph import Component, ModelIR
from passes.vision.token_prune import TokenPrune

HEADS, HEAD_DIM, GRID = 2, 4, 12


def run(model, feeds, extra=()):
    """All outputs of `model`, plus the named intermediate tensors."""
    m = copy.deepcopy(model)
    m.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in extra)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def prune(ir, **config):
    return TokenPrune(TokenPrune.Config(**config)).run(ir)


def one_layer_tower(rng):
    """q, k, v of one [CLS]-first encoder layer as inputs; its output minus [CLS] goes through LLaVA's projector."""
    seq, width = GRID + 1, HEADS * HEAD_DIM
    nodes = [
        helper.make_node("Attention", ["q", "k", "v"], ["attn"]),
        helper.make_node("Transpose", ["attn"], ["attn_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["attn_t", "hidden_shape"], ["hidden"]),
        helper.make_node("Slice", ["hidden", "one", "seq_end", "one"], ["patches"]),
        helper.make_node("MatMul", ["patches", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h1b"]),
        helper.make_node("Gelu", ["h1b"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["h2"]),
        helper.make_node("Add", ["h2", "b2"], ["image_features"]),
    ]
    qkv = [tensor(n, ["num_images", HEADS, seq, HEAD_DIM]) for n in "qkv"]
    inits = [("hidden_shape", np.array([0, seq, width])), ("one", np.array([1])), ("seq_end", np.array([seq])),
             ("w1", rng.normal(size=(width, 6)).astype(np.float32)), ("b1", rng.normal(size=6).astype(np.float32)),
             ("w2", rng.normal(size=(6, 5)).astype(np.float32)), ("b2", rng.normal(size=5).astype(np.float32))]
    model = make_model(nodes, qkv, [tensor("image_features", ["num_images", GRID, 5])], inits)
    facts = {"vision": {"image_tokens": GRID, "select_strategy": "default", "model_type": "clip_vision_model",
                        "num_layers": 1, "feature_layer": -1}}
    return ModelIR({"vision": Component("vision", [], [], onnx=model)}, facts, {})


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def channel_mean_saliency(path):
    """A user's saliency ONNX: the ReLU of the channel mean of pixel_values, [n, 1, H, W]."""
    nodes = [helper.make_node("ReduceMean", ["image", "axes"], ["mean"], keepdims=1),
             helper.make_node("Relu", ["mean"], ["map"])]
    graph = helper.make_graph(nodes, "saliency", [tensor("image", ["n", 3, 64, 64])], [tensor("map", ["n", 1, 64, 64])],
                              [helper.make_tensor("axes", 7, [1], [1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return str(path)
