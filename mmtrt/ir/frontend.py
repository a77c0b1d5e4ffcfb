"""Frontends: load a vision-language model (a Hugging Face checkpoint or a zoo model) and lower it into the IR.

What a model lowers to depends on its family (`mmtrt.ir.families`, chosen by the config's model_type); this module
finds and checks the checkpoint and hands it to its family.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import torch

from mmtrt.errors import UserError
from mmtrt.ir.families import family
from mmtrt.ir.families.common import COMPONENTS, FRONTEND_PROPERTIES
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.hub_cache import checkpoint_folder
from mmtrt.ir.preprocess import spec_from_image_processor
from mmtrt.recipe import ModelSource

__all__ = ["COMPONENTS", "FRONTEND_PROPERTIES", "describe_source", "fit_envelope", "load_source", "lower",
           "model_facts"]

CHECKPOINT_FILES = ("config.json",)


def load_source(source: ModelSource, recipe_dir: Path, own_dtype: bool = False):
    """The PyTorch model (eval; float32, or with `own_dtype` in the checkpoint's dtype, as the compiler loads it:
    each component is widened to float32 for its own export, `families.common.lowered`, so a bfloat16 checkpoint
    is never held in float32 whole) and its processor."""
    if source.source == "zoo":
        from mmtrt.zoo import build_zoo_model

        return build_zoo_model(source.name)
    import transformers

    folder, processor, fam = _checkpoint_processor(checkpoint_folder(source.path, recipe_dir))
    model_class = getattr(transformers, fam.MODEL_CLASS)
    with _checkpoint_errors(f"could not load the weights in {folder}", "re-save the model with save_pretrained"):
        dtype = "auto" if own_dtype else torch.float32
        return model_class.from_pretrained(folder, dtype=dtype).eval(), processor


def describe_source(source: ModelSource, recipe_dir: Path) -> dict[str, Any]:
    """The model facts without loading weights, for `compile --plan`."""
    if source.source == "zoo":
        from mmtrt.zoo import describe_zoo_model

        config, generation, processor = describe_zoo_model(source.name)
    else:
        from transformers import AutoConfig, GenerationConfig

        folder, processor, _ = _checkpoint_processor(checkpoint_folder(source.path, recipe_dir))
        with _checkpoint_errors(f"could not load {folder / 'config.json'}", "re-save the model with save_pretrained"):
            config = AutoConfig.from_pretrained(folder)
        try:
            generation = GenerationConfig.from_pretrained(folder)
        except OSError:
            generation = GenerationConfig.from_model_config(config.text_config)
    read_spec = getattr(family(config.model_type), "preprocess_spec", spec_from_image_processor)
    return model_facts(config, generation, processor, read_spec(processor.image_processor))


def model_facts(config, generation_config, processor, preprocess_spec: dict[str, Any]) -> dict[str, Any]:
    """The numbers every later layer (passes, shape planning, runtime) needs about the model."""
    return family(config.model_type).model_facts(config, generation_config, processor, preprocess_spec)


def fit_envelope(facts: dict[str, Any], envelope) -> dict[str, Any]:
    """The facts narrowed to the recipe's envelope where the family bounds its image tokens by it."""
    fam = family(facts["architecture"])
    if hasattr(fam, "fit_envelope"):
        return fam.fit_envelope(facts, envelope)
    if envelope.image.max_tiles is not None:
        raise UserError(f"envelope.image.max_tiles applies to any-resolution models; this {facts['architecture']} "
                        "model takes one fixed-size image: remove max_tiles")
    return facts


def lower(model, processor) -> ModelIR:
    """Export every component to ONNX and assemble the IR."""
    return family(model.config.model_type).lower(model, processor)


def _first_line(exc: Exception, limit: int = 240) -> str:
    """The exception as one line (transformers' validation errors spread the reason over several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _checkpoint_processor(folder: Path):
    """Check that `folder` is a saved checkpoint of a family mmtrt compiles; its processor (cheap: no weights)
    and its family module."""
    from transformers import AutoProcessor

    folder = folder.resolve()
    if not folder.is_dir():
        raise UserError(f"model folder {folder} does not exist; set model.path to a folder written by save_pretrained")
    missing = [f for f in CHECKPOINT_FILES if not (folder / f).is_file()]
    if missing:
        raise UserError(f"model folder {folder} has no {', '.join(missing)}; point model.path at a save_pretrained folder")
    fam = family(_read_config(folder).get("model_type"), f"model folder {folder}")
    with _checkpoint_errors(f"could not load the config and processor in {folder}",
                            "fix config.json or save the processor beside the weights with save_pretrained"):
        return folder, AutoProcessor.from_pretrained(folder), fam


@contextlib.contextmanager
def _checkpoint_errors(problem: str, fix: str):
    """What transformers raises on a broken checkpoint file: none of these share a base class below Exception."""
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, ValueError, TypeError, KeyError, SafetensorError, StrictDataclassError) as exc:
        raise UserError(f"{problem} ({_first_line(exc)}); {fix}") from None


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        config = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path} ({_first_line(exc)}); re-save the model with save_pretrained") from None
    if not isinstance(config, dict):
        raise UserError(f"{path} is not a JSON object; re-save the model with save_pretrained")
    return config
