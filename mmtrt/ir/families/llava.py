"""LLaVA-1.5-style models (`model_type: llava`): one image at the processor's fixed size, one vision pass."""

from __future__ import annotations

from typing import Any

from mmtrt.errors import UserError
from mmtrt.ir import export
from mmtrt.ir.families.common import (FRONTEND_PROPERTIES, eos_token_ids, language_components, llm_facts,
                                      lowered, tokenizer_assets)
from mmtrt.ir.graph import Component, ModelIR, TensorSpec
from mmtrt.ir.preprocess import spec_from_image_processor

MODEL_CLASS = "LlavaForConditionalGeneration"


def expected_image_tokens(processor, spec: dict[str, Any]) -> int:
    """Image tokens per image as LlavaProcessor counts them when it expands the placeholder."""
    height, width = spec["output_size"]
    patches = (height // processor.patch_size) * (width // processor.patch_size)
    drop_cls = processor.vision_feature_select_strategy == "default"
    return patches + processor.num_additional_image_tokens - int(drop_cls)


def model_facts(config, generation_config, processor, preprocess_spec: dict[str, Any]) -> dict[str, Any]:
    """The numbers every later layer (passes, shape planning, runtime) needs about the model."""
    return llava_style_facts(config, generation_config, processor, preprocess_spec, "llava",
                             image_tokens=expected_image_tokens(processor, preprocess_spec))


def llava_style_facts(config, generation_config, processor, spec: dict[str, Any], architecture: str,
                      **vision_facts: Any) -> dict[str, Any]:
    """The facts of a LLaVA-style model (a tower, its feature select, a projector, an LLM), with the family's own
    `vision_facts` (how many tokens an image takes)."""
    vision = config.vision_config
    layer = config.vision_feature_layer
    return {
        "architecture": architecture,
        "vision": {
            "model_type": vision.model_type,
            "image_size": vision.image_size,
            "input_size": list(spec["output_size"]),
            "patch_size": vision.patch_size,
            "num_layers": vision.num_hidden_layers,
            "hidden_size": vision.hidden_size,
            "feature_layer": layer if isinstance(layer, int) else list(layer),
            "select_strategy": config.vision_feature_select_strategy,
            **vision_facts,
        },
        "llm": llm_facts(config.text_config),
        "image_token": processor.image_token,
        "image_token_id": config.image_token_id,
        "eos_token_ids": eos_token_ids(generation_config),
        "chat_template": processor.chat_template,
    }


def lower(model, processor) -> ModelIR:
    """Export every component to ONNX and assemble the IR."""
    spec = spec_from_image_processor(processor.image_processor)
    facts = model_facts(model.config, model.generation_config, processor, spec)
    v = facts["vision"]
    size = tuple(spec["output_size"])
    vision = lowered("vision", v, lambda: export.export_vision(model, v["feature_layer"], v["select_strategy"], size),
                     export.vision_modules(model))
    exported_tokens = vision.outputs[0].shape[1]
    if exported_tokens != v["image_tokens"]:
        raise UserError(f"the vision tower yields {exported_tokens} tokens per image but the processor expands "
                        f"the image placeholder to {v['image_tokens']}; the checkpoint's processor does not fit its model")
    components = {
        "preprocess": Component(
            "preprocess",
            inputs=[TensorSpec("image", "uint8", ("height", "width", 3))],
            outputs=[TensorSpec("pixel_values", "float32", (1, 3, *size))],
            spec=spec,
        ),
        "vision": vision,
        **language_components(model, facts["llm"]),
    }
    return ModelIR(components, facts, tokenizer_assets(processor), set(FRONTEND_PROPERTIES))
