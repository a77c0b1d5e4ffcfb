"""Qwen2-VL and Qwen2.5-VL (`qwen2_vl`, `qwen2_5_vl`): native dynamic resolution and M-RoPE.

An image keeps its aspect ratio: the processor resizes it to sides that are multiples of patch x merge (28) with
an area between its `min_pixels` and `max_pixels`, so its token count (patches / 4) follows its size. That range
is the bundle's envelope in pixels: it becomes the planned dimensions `tokens` (1 .. max_pixels / 28^2; the
smallest image a processor makes may fall below min_pixels when it is very elongated) and `patches` (4 x tokens),
and the LLM's sequence holds prompt + the most image tokens. A larger range is a checkpoint whose processor was
saved with other `min_pixels` / `max_pixels`. The vision graph's inputs are in mmtrt/ir/families/qwen2_vl_export.py,
the runtime's side in mmtrt/runtime/qwen2_vl.py.
"""

from __future__ import annotations

import math
from typing import Any

from mmtrt.errors import UserError
from mmtrt.ir.families.common import eos_token_ids, llm_facts, lowered, tokenizer_assets
from mmtrt.ir.graph import Component, ModelIR, TensorSpec

MODEL_CLASS = "AutoModelForImageTextToText"
COMPONENTS = ("preprocess", "vision", "embed", "llm")
PROPERTIES = frozenset({"llm.kv_cache.hf"})

# Passes this family refuses at `compile --plan`, with the reason.
REFUSED_PASSES = {
    "token_prune": "token_prune scores tokens on a fixed patch grid ([CLS] attention, saliency); Qwen2-VL's token "
                   "count and M-RoPE positions follow each image's grid, which a pruned block would have to keep",
    "channel_prune": "channel_prune's dependency groups cover the CLIP/SigLIP and LLaMA graphs; Qwen2-VL's vision "
                     "blocks (and the merger that reads 4 x the width) are not matched yet",
    "dead_layer_elimination": "Qwen2-VL's merger reads the vision tower's last layer: no layer follows the "
                              "feature layer",
}
# TensorRT-LLM's M-RoPE (the mrope_rotary_cos_sin its runner computes, tensorrt_llm/runtime/multimodal_model_runner.py)
# takes unscaled frequencies: create_sinusoidal_positions_for_attention_plugin with RotaryScalingType.mrope
TRTLLM_ROPE_TYPES = ("default", "mrope")


def trtllm_refused(text) -> str | None:
    """Why no TensorRT-LLM checkpoint is written for this decoder, or None (the checkpoint is qwen_type qwen2_vl)."""
    rope_type = text.rope_parameters.get("rope_type", "default")
    if rope_type in TRTLLM_ROPE_TYPES:
        return None
    return (f"the LLM's M-RoPE is scaled (rope_type {rope_type}); TensorRT-LLM's Qwen2-VL path computes "
            "mrope_rotary_cos_sin from unscaled frequencies, so no checkpoint is written")


def preprocess_spec(image_processor) -> dict[str, Any]:
    """Qwen2VLImageProcessor as a spec (ops: convert_rgb, smart_resize, rescale, normalize, patchify)."""
    ip = image_processor
    if type(ip).__name__ not in ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorPil"):
        raise UserError(f"image processor {type(ip).__name__} is not Qwen2-VL's; re-save the checkpoint with "
                        "Qwen2VLImageProcessor")
    if not ip.do_resize:
        raise UserError(f"{type(ip).__name__} has do_resize=False; mmtrt needs the resize to multiples of the patch "
                        "and merge size; set do_resize to true")
    ops: list[dict[str, Any]] = [{"op": "convert_rgb"}] if ip.do_convert_rgb else []
    resample = getattr(ip.resample, "value", ip.resample)
    interpolation = {2: "bilinear", 3: "bicubic", "bilinear": "bilinear", "bicubic": "bicubic"}.get(resample)
    if interpolation is None:
        raise UserError(f"{type(ip).__name__}.resample={ip.resample!r} is not supported; use bicubic or bilinear")
    ops.append({"op": "smart_resize", "factor": ip.patch_size * ip.merge_size,
                "min_pixels": int(ip.size["shortest_edge"]), "max_pixels": int(ip.size["longest_edge"]),
                "interpolation": interpolation, "antialias": True})
    if ip.do_rescale:
        ops.append({"op": "rescale", "factor": float(ip.rescale_factor)})
    if ip.do_normalize:
        ops.append({"op": "normalize", "mean": [float(v) for v in ip.image_mean],
                    "std": [float(v) for v in ip.image_std]})
    ops.append({"op": "patchify", "patch_size": ip.patch_size, "merge_size": ip.merge_size,
                "temporal_patch_size": ip.temporal_patch_size})
    return {"version": 1, "family": "qwen2_vl", "ops": ops, "output_size": None}


def token_dims(spec: dict[str, Any], merge: int) -> dict[str, dict[str, int]]:
    """Planned `tokens` and `patches` from the processor's pixel range."""
    resize = next(op for op in spec["ops"] if op["op"] == "smart_resize")
    most = resize["max_pixels"] // resize["factor"] ** 2
    if most < 1:
        raise UserError(f"the processor's max_pixels {resize['max_pixels']} is below one {resize['factor']}x"
                        f"{resize['factor']} block; re-save it with a larger max_pixels")
    tokens = {"min": 1, "opt": most, "max": most}
    return {"tokens": tokens, "patches": {k: v * merge * merge for k, v in tokens.items()}}


def model_facts(config, generation_config, processor, spec: dict[str, Any]) -> dict[str, Any]:
    """The facts later layers read; `vision.image_tokens` is the most one image takes (the sequence's budget)."""
    text, vision = config.text_config, config.vision_config
    merge = vision.spatial_merge_size
    dims = token_dims(spec, merge)
    side = math.isqrt(dims["tokens"]["max"]) * vision.patch_size * merge
    windowed = config.model_type == "qwen2_5_vl"
    return {
        "architecture": config.model_type,
        "vision": {
            "model_type": vision.model_type,
            "patch_size": vision.patch_size,
            "merge_size": merge,
            "temporal_patch_size": vision.temporal_patch_size,
            "window_size": vision.window_size if windowed else None,
            "full_layers": list(vision.fullatt_block_indexes) if windowed else None,
            "num_layers": vision.depth,
            "hidden_size": vision.hidden_size if windowed else vision.embed_dim,
            "input_size": [side, side],
            "image_tokens": dims["tokens"]["max"],
            "dims": dims,
        },
        "llm": {
            **llm_facts(text),
            "rope": "mrope",
            "mrope_section": list(text.rope_parameters["mrope_section"]),
            "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
            **({"trtllm_refused": why} if (why := trtllm_refused(text)) else {}),
        },
        "image_token": processor.image_token,
        "image_token_id": config.image_token_id,
        "eos_token_ids": eos_token_ids(generation_config),
        "chat_template": processor.chat_template,
        "refused_passes": REFUSED_PASSES,
    }


def lower(model, processor) -> ModelIR:
    """Export the vision tower, the embedding and the M-RoPE decoder; preprocessing stays a spec."""
    from mmtrt.ir.export import export_embedding
    from mmtrt.ir.families import qwen2_vl_export as export

    spec = preprocess_spec(processor.image_processor)
    facts = model_facts(model.config, model.generation_config, processor, spec)
    v, t = facts["vision"], facts["llm"]
    lm = model.model.language_model
    cpp = 3 * v["temporal_patch_size"] * v["patch_size"] ** 2
    components = {
        "preprocess": Component(
            "preprocess",
            inputs=[TensorSpec("image", "uint8", ("height", "width", 3))],
            outputs=[TensorSpec("pixel_values", "float32", ("patches", cpp))],
            spec=spec,
        ),
        "vision": lowered("vision", v, lambda: export.export_vision(model, v["window_size"] is not None, (6, 10)),
                          [model.model.visual]),
        "embed": lowered("embed", {k: t[k] for k in ("vocab_size", "hidden_size")}, lambda: export_embedding(model),
                         [lm.embed_tokens]),
        "llm": lowered("llm", t, lambda: export.export_decoder(model, t["num_layers"], t["num_kv_heads"], t["head_dim"],
                                                                t["hidden_size"]), [lm, model.lm_head]),
    }
    return ModelIR(components, facts, tokenizer_assets(processor), set(PROPERTIES))


def fit_envelope(facts: dict[str, Any], envelope) -> dict[str, Any]:
    """The image envelope in pixels is the processor's; tiles do not apply."""
    if envelope.image.max_tiles is not None:
        raise UserError("envelope.image.max_tiles applies to any-resolution (tiling) models; Qwen2-VL bounds an "
                        "image's tokens by its processor's max_pixels: remove max_tiles")
    return facts
