"""Random-weight Hugging Face checkpoints of real architectures, written tensor by tensor.

The model is built on the meta device (shapes only) and every tensor is drawn and written straight into
`model.safetensors`, so writing a 7B-shaped checkpoint takes the memory of its largest tensor, not of the model.
Weights are small (std 0.02) so deep stacks stay finite; norm weights are ones; the embedding rows the tokenizer
cannot produce are zero, so greedy picks stay in its vocabulary. The tokenizer is mmtrt's byte tokenizer.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch

STD = 0.02
DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def tensor_shapes(model_class, config) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors (names as save_pretrained writes them, tied ones once) and their shapes."""
    with torch.device("meta"):
        model = model_class(config)
    tied = set(getattr(model, "_tied_weights_keys", None) or {}) if config.get_text_config().tie_word_embeddings \
        else set()
    return {name: tuple(t.shape) for name, t in model.state_dict().items() if name not in tied}


def _value(name: str, shape: tuple[int, ...], rng: np.random.Generator, vocab: int) -> np.ndarray:
    if len(shape) == 1 and "norm" in name and name.endswith("weight"):
        return np.ones(shape, np.float32)
    out = rng.standard_normal(shape, dtype=np.float32)
    out *= STD
    if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        out[vocab:] = 0.0
    return out


def write_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, seed: int,
                      vocab: int) -> int:
    """Write every tensor in turn; returns the file's bytes."""
    size = torch.empty((), dtype=dtype).element_size()
    header, offset = {}, 0
    for name, shape in sorted(shapes.items()):
        nbytes = int(np.prod(shape, dtype=np.int64)) * size
        header[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for i, (name, shape) in enumerate(sorted(shapes.items())):
            value = torch.from_numpy(_value(name, shape, np.random.default_rng([seed, i]), vocab)).to(dtype)
            f.write(memoryview(value.view(torch.uint8).numpy()))
    return 8 + len(blob) + offset


def write_checkpoint(folder: Path, model_class, config, processor, generation, dtype=torch.float32,
                     seed: int = 0) -> int:
    """A save_pretrained-style folder: config, generation config, processor and model.safetensors; returns the
    weights' bytes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config.dtype = dtype
    config.save_pretrained(folder)
    generation.save_pretrained(folder)
    processor.save_pretrained(folder)
    return write_safetensors(folder / "model.safetensors", tensor_shapes(model_class, config), dtype, seed,
                             len(processor.tokenizer))
