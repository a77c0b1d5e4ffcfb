"""LLaVA-OneVision (`model_type: llava_onevision`): LLaVA-NeXT's tiling (see `families/anyres.py`) with
`anyres_max_N` pooling: a grid of features above about N tiles' worth is shrunk bilinearly to that. Typically a
SigLIP tower (no [CLS]) and a Qwen2 LLM. One image per prompt: the multi-image and video paths are not lowered."""

from __future__ import annotations

import re
from typing import Any

from mmtrt.errors import UserError
from mmtrt.ir.families import anyres
from mmtrt.ir.graph import ModelIR

MODEL_CLASS = "LlavaOnevisionForConditionalGeneration"
fit_envelope = anyres.fit_envelope


def max_patches(config, processor) -> int:
    """N of the config's vision_aspect_ratio `anyres_max_N`, which the processor must count with too."""
    ratio = config.vision_aspect_ratio
    match = re.fullmatch(r"anyres_max_(\d+)", str(ratio))
    if match is None:
        raise UserError(f"vision_aspect_ratio {ratio!r} is not supported; mmtrt lowers anyres_max_N")
    if getattr(processor, "vision_aspect_ratio", ratio) != ratio:
        raise UserError(f"the processor's vision_aspect_ratio {processor.vision_aspect_ratio!r} differs from the "
                        f"model config's {ratio!r}; save the processor that belongs to the model")
    return int(match.group(1))


def model_facts(config, generation_config, processor, preprocess_spec: dict[str, Any]) -> dict[str, Any]:
    return anyres.anyres_facts(config, generation_config, processor, preprocess_spec, max_patches(config, processor))


def lower(model, processor) -> ModelIR:
    return anyres.lower(model, processor, max_patches(model.config, processor))
