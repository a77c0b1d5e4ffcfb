"""transformers as the reference for an exported folder: an AutoAWQ GEMM folder's float twin (its INT4 weights
dequantized as AutoAWQ computes them; transformers' AWQ loader needs gptqmodel, which does not install here), and
teacher-forced top-1 agreement with an answer, as mmtrt's agreement suite measures it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from builders import hf_inputs
from safetensors import safe_open
from safetensors.torch import save_file

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def unpack_awq(packed: np.ndarray) -> np.ndarray:
    """AutoAWQ GEMM's int32 [rows, cols / 8] -> [rows, cols]: nibble i of column c holds column 8c + [0, 2, 4, 6,
    1, 3, 5, 7][i] (AutoAWQ's WQLinear_GEMM.from_linear packs in that order)."""
    words = packed.view(np.uint32)
    out = np.zeros((packed.shape[0], packed.shape[1] * 8), np.int64)
    for i in range(8):
        out[:, AWQ_ORDER[i]::8] = (words >> (4 * i)) & 0xF
    return out


def awq_weight(tensors: dict, module: str, group: int) -> np.ndarray:
    """The float weight [out, in] an AutoAWQ GEMM linear computes with: (q - zero) * scale per group of inputs."""
    q, zeros = unpack_awq(tensors[f"{module}.qweight"]), unpack_awq(tensors[f"{module}.qzeros"])
    scales = tensors[f"{module}.scales"].astype(np.float32)
    return ((q - np.repeat(zeros, group, axis=0)) * np.repeat(scales, group, axis=0)).T.astype(np.float32)


def read_tensors(folder: Path) -> dict[str, np.ndarray]:
    with safe_open(folder / "model.safetensors", "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)


def float_twin(folder: Path, out: Path, dense: dict[str, np.ndarray] | None = None) -> Path:
    """`folder` with every AWQ linear written as its float weight (`dense`: module -> weight, else dequantized
    from the folder) and no quantization_config: what transformers loads as the folder's model."""
    tensors = read_tensors(folder)
    config = json.loads((folder / "config.json").read_text())
    group = config.pop("quantization_config")["group_size"]
    if dense is None:
        dense = {k.removesuffix(".qweight"): None for k in tensors if k.endswith(".qweight")}
        dense = {m: awq_weight(tensors, m, group) for m in dense}
    shutil.copytree(folder, out)
    (out / "config.json").write_text(json.dumps(config))
    kept = {k: torch.from_numpy(v) for k, v in tensors.items() if not k.endswith(("qweight", "qzeros", "scales"))}
    save_file(kept | {f"{m}.weight": torch.from_numpy(np.ascontiguousarray(w)) for m, w in dense.items()},
              out / "model.safetensors", metadata={"format": "pt"})
    return out


def placeholder_ids(model) -> set[int]:
    """Token ids that transformers reads as the image's wherever they stand: an answer holding one cannot be fed
    after the prompt (a random-weight model may emit them)."""
    names = ("image_token_id", "image_token_index", "video_token_id", "vision_start_token_id")
    return {getattr(model.config, n) for n in names if getattr(model.config, n, None) is not None}


def hf_answer_agreement(model, processor, image, prompt: str, answer: list[int]) -> tuple[int, int]:
    """(positions where transformers' argmax is `answer`'s token, positions), `answer` fed after the prompt."""
    inputs = hf_inputs(processor, image, prompt)
    n = inputs["input_ids"].shape[1]
    ids = torch.cat([inputs["input_ids"], torch.tensor([answer])], 1)
    full = {**inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if "mm_token_type_ids" in inputs:  # Qwen2-VL's marks of the image's tokens: the answer's are text
        full["mm_token_type_ids"] = torch.nn.functional.pad(inputs["mm_token_type_ids"], (0, len(answer)))
    with torch.no_grad():
        chosen = model(**full).logits[0, n - 1:n - 1 + len(answer)].argmax(-1)
    return int((chosen == torch.tensor(answer)).sum()), len(answer)
