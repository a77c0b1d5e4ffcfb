"""Frontends: load a LLaVA-style model (a Hugging Face checkpoint or a zoo model) and lower it into the IR."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from mmtrt.errors import UserError
from mmtrt.ir import export
from mmtrt.ir.families import qwen2_vl
from mmtrt.ir.graph import Component, ModelIR, TensorSpec, graph_io
from mmtrt.ir.preprocess import spec_from_image_processor
from mmtrt.recipe import ModelSource

CHECKPOINT_FILES = ("config.json",)
COMPONENTS = ("preprocess", "vision", "embed", "llm")
QWEN = ("qwen2_vl", "qwen2_5_vl")
FRONTEND_PROPERTIES = frozenset({"vision.hidden_state_stack", "llm.kv_cache.hf"})


def load_source(source: ModelSource, recipe_dir: Path):
    """The PyTorch model (fp32, eval) and its processor."""
    if source.source == "zoo":
        from mmtrt.zoo import build_zoo_model

        return build_zoo_model(source.name)
    import transformers

    folder, processor = _checkpoint_processor(recipe_dir / source.path)
    name = qwen2_vl.MODEL_CLASS if _read_config(folder).get("model_type") in QWEN else "LlavaForConditionalGeneration"
    with _checkpoint_errors(f"could not load the weights in {folder}", "re-save the model with save_pretrained"):
        return getattr(transformers, name).from_pretrained(folder, dtype=torch.float32).eval(), processor


def describe_source(source: ModelSource, recipe_dir: Path) -> dict[str, Any]:
    """The model facts without loading weights, for `compile --plan`."""
    if source.source == "zoo":
        from mmtrt.zoo import describe_zoo_model

        config, generation, processor = describe_zoo_model(source.name)
    else:
        from transformers import AutoConfig, GenerationConfig

        folder, processor = _checkpoint_processor(recipe_dir / source.path)
        with _checkpoint_errors(f"could not load {folder / 'config.json'}", "re-save the model with save_pretrained"):
            config = AutoConfig.from_pretrained(folder)
        try:
            generation = GenerationConfig.from_pretrained(folder)
        except OSError:
            generation = GenerationConfig.from_model_config(config.text_config)
    if config.model_type in QWEN:
        return qwen2_vl.model_facts(config, generation, processor, qwen2_vl.preprocess_spec(processor.image_processor))
    return model_facts(config, generation, processor, spec_from_image_processor(processor.image_processor))


def _first_line(exc: Exception, limit: int = 240) -> str:
    """The exception as one line (transformers' validation errors spread the reason over several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _checkpoint_processor(folder: Path):
    """Check that `folder` is a saved LLaVA checkpoint and load its processor (cheap: no weights)."""
    from transformers import AutoProcessor

    folder = folder.resolve()
    if not folder.is_dir():
        raise UserError(f"model folder {folder} does not exist; set model.path to a folder written by save_pretrained")
    missing = [f for f in CHECKPOINT_FILES if not (folder / f).is_file()]
    if missing:
        raise UserError(f"model folder {folder} has no {', '.join(missing)}; point model.path at a save_pretrained folder")
    model_type = _read_config(folder).get("model_type")
    if model_type not in ("llava", *QWEN):
        raise UserError(f"model folder {folder} holds a {model_type!r} model; mmtrt compiles LLaVA-style checkpoints (model_type llava)")
    with _checkpoint_errors(f"could not load the config and processor in {folder}",
                            "fix config.json or save the processor beside the weights with save_pretrained"):
        return folder, AutoProcessor.from_pretrained(folder)


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


def expected_image_tokens(processor, spec: dict[str, Any]) -> int:
    """Image tokens per image as LlavaProcessor counts them when it expands the placeholder."""
    height, width = spec["output_size"]
    patches = (height // processor.patch_size) * (width // processor.patch_size)
    drop_cls = processor.vision_feature_select_strategy == "default"
    return patches + processor.num_additional_image_tokens - int(drop_cls)


def model_facts(config, generation_config, processor, preprocess_spec: dict[str, Any]) -> dict[str, Any]:
    """The numbers every later layer (passes, shape planning, runtime) needs about the model."""
    text, vision = config.text_config, config.vision_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    eos = generation_config.eos_token_id
    if isinstance(config.vision_feature_layer, list):
        raise UserError("vision_feature_layer lists several layers; mmtrt supports one feature layer for now")
    return {
        "architecture": "llava",
        "vision": {
            "model_type": vision.model_type,
            "image_size": vision.image_size,
            "input_size": list(preprocess_spec["output_size"]),
            "patch_size": vision.patch_size,
            "num_layers": vision.num_hidden_layers,
            "hidden_size": vision.hidden_size,
            "feature_layer": config.vision_feature_layer,
            "select_strategy": config.vision_feature_select_strategy,
            "image_tokens": expected_image_tokens(processor, preprocess_spec),
        },
        "llm": {
            "model_type": text.model_type,
            "num_layers": text.num_hidden_layers,
            "hidden_size": text.hidden_size,
            "num_heads": text.num_attention_heads,
            "num_kv_heads": text.num_key_value_heads,
            "head_dim": head_dim,
            "vocab_size": text.vocab_size,
            "max_position_embeddings": text.max_position_embeddings,
        },
        "image_token": processor.image_token,
        "image_token_id": config.image_token_id,
        "eos_token_ids": sorted(eos if isinstance(eos, list) else [eos]),
        "chat_template": processor.chat_template,
    }


def tokenizer_assets(processor) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        processor.tokenizer.save_pretrained(tmp)
        return {f"tokenizer/{p.name}": p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}


def lower(model, processor) -> ModelIR:
    """Export every component to ONNX and assemble the IR."""
    if model.config.model_type in QWEN:
        return qwen2_vl.lower(model, processor)
    spec = spec_from_image_processor(processor.image_processor)
    facts = model_facts(model.config, model.generation_config, processor, spec)
    v, t = facts["vision"], facts["llm"]
    size = tuple(spec["output_size"])
    vision = _onnx_component("vision", export.export_vision(model, v["feature_layer"], v["select_strategy"], size))
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
        "embed": _onnx_component("embed", export.export_embedding(model)),
        "llm": _onnx_component(
            "llm", export.export_decoder(model, t["num_layers"], t["num_kv_heads"], t["head_dim"], t["hidden_size"])),
    }
    return ModelIR(components, facts, tokenizer_assets(processor), set(FRONTEND_PROPERTIES))


def _onnx_component(name: str, model) -> Component:
    return Component(name, graph_io(model, "inputs"), graph_io(model, "outputs"), onnx=model)
