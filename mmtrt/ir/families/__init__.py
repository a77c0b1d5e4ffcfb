"""Model families: one module per kind of checkpoint, chosen by its config's `model_type`.

A family module lowers its models into the IR the rest of mmtrt reads. It provides:

- `MODEL_CLASS`: the name of the transformers class that loads its checkpoints (`from_pretrained`);
- `model_facts(config, generation_config, processor, preprocess_spec)`: the facts passes, shape planning and the
  runtimes read (see `families/llava.py`; `architecture` is the model_type, which finds the family again), from
  configs alone, so `compile --plan` builds no weights;
- `lower(model, processor)`: the `ModelIR`, every component exported;
- optionally `preprocess_spec(image_processor)`: the preprocessing spec, where the family's processor is not one
  `mmtrt.ir.preprocess` reads (Qwen2-VL's resize to the image's own size);
- optionally `fit_envelope(facts, envelope)`: the facts narrowed to the recipe's envelope (any-resolution models
  bound their image tokens by `envelope.image.max_tiles`); without it, such envelope keys are refused.

A new family is one module here and one line in FAMILIES.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from mmtrt.errors import UserError

FAMILIES = {
    "llava": "mmtrt.ir.families.llava",
    "llava_next": "mmtrt.ir.families.llava_next",
    "llava_onevision": "mmtrt.ir.families.llava_onevision",
    "qwen2_vl": "mmtrt.ir.families.qwen2_vl",
    "qwen2_5_vl": "mmtrt.ir.families.qwen2_vl",
}


def supported() -> str:
    return ", ".join(sorted(FAMILIES))


def family(model_type: str | None, where: str = "the model") -> ModuleType:
    """The family module of `model_type`; an unknown one is refused in one line listing the supported ones."""
    module = FAMILIES.get(model_type)
    if module is None:
        raise UserError(f"{where} is a {model_type!r} model; mmtrt compiles model_type {supported()}")
    return importlib.import_module(module)
