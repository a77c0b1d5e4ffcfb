"""Small vision graphs and helpers shared by the token_prune tests."""

import copy

import numpy as np
import torch
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from builders import make_model, tensor
from conftest import ROOT
from mmtrt.ir.graph import Component, ModelIR
from mmtrt.zoo.tiny_llava import build_tiny_llava
from passes.vision.token_prune import TokenPrune

HEADS, HEAD_DIM, GRID = 2, 4, 12
DYNAMIC = "  - token_prune: {budget: dynamic, method: cls_attention, mass: 0.9, min: 4, max: 40}\n"
SHARPEN = 30  # the random tiny tower attends almost uniformly: every image would keep the same count


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


def dynamic_tiny_recipe(folder, more_passes: str = ""):
    """(folder, recipe text) of the tiny LLaVA under a dynamic budget, its vision queries scaled so that [CLS]
    attention, and so the kept count, differs from image to image; the checkpoint is saved in folder."""
    model, processor = build_tiny_llava()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "vision" in name and "q_proj" in name:
                weight.mul_(SHARPEN)
    model.save_pretrained(folder / "checkpoint")
    processor.save_pretrained(folder / "checkpoint")
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text()
    recipe = recipe.replace("{source: zoo, name: tiny-llava}", "{source: hf, path: checkpoint}")
    return folder, recipe.replace("envelope:", DYNAMIC + more_passes + "envelope:")
