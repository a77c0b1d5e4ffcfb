"""Frontends: load a LLaVA-style model (a Hugging Face checkpoint or a zoo model) and lower it into the IR."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from mmtrt.errors import UserError
from mmtrt.ir import export
from mmtrt.ir.graph import Component, ModelIR, TensorSpec, graph_io
from mmtrt.ir.preprocess import spec_from_image_processor
from mmtrt.recipe import ModelSource

CHECKPOINT_FILES = ("config.json",)


def load_source(source: ModelSource, recipe_dir: Path):
    """The PyTorch model (fp32, eval) and its processor."""
    if source.source == "zoo":
        from mmtrt.zoo import build_zoo_model

        return build_zoo_model(source.name)
    return _load_checkpoint((recipe_dir / source.path).resolve())


def _load_checkpoint(folder: Path):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    if not folder.is_dir():
        raise UserError(f"model folder {folder} does not exist; set model.path to a folder written by save_pretrained")
    missing = [f for f in CHECKPOINT_FILES if not (folder / f).is_file()]
    if missing:
        raise UserError(f"model folder {folder} has no {', '.join(missing)}; point model.path at a save_pretrained folder")
    model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    if model_type != "llava":
        raise UserError(f"model folder {folder} holds a {model_type!r} model; mmtrt compiles LLaVA-style checkpoints (model_type llava)")
    try:
        model = LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
        processor = AutoProcessor.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise UserError(f"could not load the checkpoint in {folder} ({str(exc).splitlines()[0]}); check that tokenizer and processor files are saved beside the weights") from None
    return model, processor


def model_facts(model, processor) -> dict[str, Any]:
    """The numbers every later layer (passes, shape planning, runtime) needs about the model."""
    cfg = model.config
    text, vision = cfg.text_config, cfg.vision_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    tokenizer = processor.tokenizer
    eos = model.generation_config.eos_token_id
    return {
        "architecture": "llava",
        "vision": {
            "model_type": vision.model_type,
            "image_size": vision.image_size,
            "patch_size": vision.patch_size,
            "num_layers": vision.num_hidden_layers,
            "hidden_size": vision.hidden_size,
            "feature_layer": cfg.vision_feature_layer,
            "select_strategy": cfg.vision_feature_select_strategy,
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
        "image_token_id": cfg.image_token_id,
        "eos_token_ids": sorted(eos if isinstance(eos, list) else [eos]),
        "chat_template": processor.chat_template,
    }


def tokenizer_assets(processor) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        processor.tokenizer.save_pretrained(tmp)
        return {f"tokenizer/{p.name}": p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}


def lower(model, processor) -> ModelIR:
    """Export every component to ONNX and assemble the IR."""
    facts = model_facts(model, processor)
    v, t = facts["vision"], facts["llm"]
    if isinstance(v["feature_layer"], list):
        raise UserError("vision_feature_layer lists several layers; mmtrt supports one feature layer for now")
    preprocess_spec = spec_from_image_processor(processor.image_processor)
    size = tuple(preprocess_spec["output_size"])
    vision = export.export_vision(model, v["feature_layer"], v["select_strategy"], size)
    embed = export.export_embedding(model)
    llm = export.export_decoder(model, t["num_layers"], t["num_kv_heads"], t["head_dim"], t["hidden_size"])
    components = {
        "preprocess": Component(
            "preprocess",
            inputs=[TensorSpec("image", "uint8", ("height", "width", 3))],
            outputs=[TensorSpec("pixel_values", "float32", (1, 3, *size))],
            spec=preprocess_spec,
        ),
        "vision": _onnx_component("vision", vision),
        "embed": _onnx_component("embed", embed),
        "llm": _onnx_component("llm", llm),
    }
    facts["vision"]["image_tokens"] = components["vision"].outputs[0].shape[1]
    properties = {"vision.hidden_state_stack", "llm.kv_cache.hf"}
    return ModelIR(components, facts, tokenizer_assets(processor), properties)


def _onnx_component(name: str, model) -> Component:
    return Component(name, graph_io(model, "inputs"), graph_io(model, "outputs"), onnx=model)
