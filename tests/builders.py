"""Tiny inputs and graphs built by hand, shared by the tests."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from PIL import Image


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
