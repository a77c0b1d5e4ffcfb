"""LLaVA-NeXT (`model_type: llava_next`): any-resolution tiling, every row of the image's features ended by
`image_newline` (see `families/anyres.py`)."""

from __future__ import annotations

from typing import Any

from mmtrt.ir.families import anyres
from mmtrt.ir.graph import ModelIR

MODEL_CLASS = "LlavaNextForConditionalGeneration"
fit_envelope = anyres.fit_envelope


def model_facts(config, generation_config, processor, preprocess_spec: dict[str, Any]) -> dict[str, Any]:
    return anyres.anyres_facts(config, generation_config, processor, preprocess_spec, max_patches=None)


def lower(model, processor) -> ModelIR:
    return anyres.lower(model, processor, max_patches=None)
