"""transformers' parameter names to the Hugging Face Hub's key layout, which vLLM reads.

transformers 5 holds a LLaVA-family model as `model.language_model.*`, `model.vision_tower.*` (a CLIP or SigLIP
tower without its `vision_model` level), `model.multi_modal_projector.*`, `model.image_newline` and `lm_head.*`,
and saves the tower without that level too; the Hub's checkpoints (and vLLM 0.32, which refuses
`vision_tower.embeddings`) have `language_model.model.*`, `language_model.lm_head.*` and
`vision_tower.vision_model.*`. These rules are the inverse of transformers' own
(conversion_mapping.py: the `llava` / `llava_next` WeightRenaming lists and CLIPVisionModel's PrefixChange of
`vision_model`; `llava_onevision` maps to `llava_next`). Qwen2-VL's Hub layout is `visual.*`, `model.*` (the
decoder) and `lm_head.*`."""

from __future__ import annotations

LLAVA = (("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."),
         ("model.vision_tower.", "vision_tower.vision_model."), ("model.multi_modal_projector.", "multi_modal_projector."),
         ("model.image_newline", "image_newline"))
QWEN2_VL = (("model.visual.", "visual."), ("model.language_model.", "model."), ("lm_head.", "lm_head."))
RULES = {"llava": LLAVA, "llava_next": LLAVA, "llava_onevision": LLAVA, "qwen2_vl": QWEN2_VL, "qwen2_5_vl": QWEN2_VL}


def hub_name(model_type: str, name: str) -> str:
    """The Hub's name of transformers' parameter `name` (a tower already named `vision_model` keeps one level)."""
    for old, new in RULES[model_type]:
        if name.startswith(old):
            rest = name[len(old):]
            if new.endswith("vision_model.") and rest.startswith("vision_model."):
                rest = rest[len("vision_model."):]
            return new + rest
    raise ValueError(f"{name} is not a parameter of a {model_type} model transformers names")
