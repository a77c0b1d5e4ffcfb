"""`mmtrt export hf BUNDLE OUT`: the model as compiled, as a Hugging Face folder in the Hub's key layout that
transformers and vLLM load (config, processor, chat template, tokenizer, safetensors, a model card).

The LLM's weights are the bundle's graphs' (handoff/llm_weights.py), so its passes carry over: a channel-pruned
width becomes the config's size, and awq_int4's INT4 linears are written in AutoAWQ's GEMM packing with its
`quantization_config` (handoff/awq_gemm.py), which vLLM reads, or with `--format modelopt` in ModelOpt's
W4A16_AWQ with hf_quant_config.json (handoff/modelopt_w4a16.py), which TensorRT-LLM's LLM API reads. The config,
processor and the vision tower and projector come from the source checkpoint the recipe names (the bundle keeps no
config of its own; its vision graph's weights are the source's where its vision passes are lossless, and the
export says in one line where they are not). What a Hugging Face folder cannot express (token pruning, plugins) is
named in one line each: it stays on mmtrt's side of the split, which hands an engine the image features
(image_embeds) the bundle computes. The folder is written beside OUT and
renamed into place, so nothing half-written remains."""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from mmtrt.bundle.manifest import read_manifest
from mmtrt.errors import UserError
from mmtrt.handoff.hub_layout import RULES, hub_name
from mmtrt.handoff.trtllm_export import NotExportable

LLM_PREFIX = "model.language_model."
VLLM_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
              "up_proj": "gate_up_proj"}  # the modules vLLM loads them into, which its skip list matches
WEIGHT_PASSES_ON_VISION = ("awq_int4", "int8_weights", "cast_precision", "channel_prune", "recover")


def export_hf(bundle: str | os.PathLike, out: str | os.PathLike, *,
              source: str | os.PathLike | None = None, format: str = "auto") -> dict[str, Any]:
    """Write OUT (which must not exist) from BUNDLE; `source` overrides the checkpoint folder the recipe names
    (relative paths in the recipe are read against the bundle's folder); `format` "modelopt" writes awq_int4 as
    ModelOpt's W4A16_AWQ (handoff/modelopt_w4a16.py). Returns what was written and the lines for what the
    folder does not express."""
    bundle, out = Path(bundle), Path(out)
    if out.exists():
        raise UserError(f"{out} exists; name a new folder for the export (or remove that one)")
    manifest = read_manifest(bundle)
    family = manifest["model"]["architecture"]
    if family not in RULES:
        raise UserError(f"{bundle} holds a {family} model; mmtrt export hf writes {', '.join(sorted(RULES))}")
    model, processor = _source_model(manifest, bundle, source)
    if format not in ("auto", "modelopt"):
        raise UserError(f"unknown export format {format!r}; use auto or modelopt")
    state, config, quantization, floats, hf_quant = _state_and_config(model, bundle, manifest, format)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write(stage, family, state, config, model, processor)
        if hf_quant is not None:
            (stage / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=4) + "\n")
        notes = not_expressed(manifest) + floats
        (stage / "README.md").write_text(model_card(manifest, notes))
        if out.exists():
            raise UserError(f"{out} appeared during the export; the export was discarded")
        stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return {"out": str(out), "family": family, "quantization": quantization, "not_expressed": notes}


def _source_model(manifest: dict, bundle: Path, source):
    from mmtrt.ir.frontend import load_source
    from mmtrt.ir.hub_cache import HUB_ID
    from mmtrt.recipe import ModelSource

    model = ModelSource(**manifest["recipe"]["model"])
    if source is not None:
        model = ModelSource(source="hf", path=str(Path(source).resolve()))
    elif model.source == "hf" and not (bundle.parent / model.path).exists() and not HUB_ID.fullmatch(model.path):
        raise UserError(f"the bundle's source checkpoint {model.path} is not beside {bundle} (the recipe's path is "
                        "read against the bundle's folder); pass --source CHECKPOINT_FOLDER")
    return load_source(model, bundle.parent)


def _state_and_config(model, bundle: Path, manifest: dict, fmt: str):
    """The source's vision tower and projector with the bundle's LLM, and the config with its sizes."""
    import onnx
    import torch

    from mmtrt.handoff.llm_weights import llm_tensors

    components = manifest["components"]
    facts = manifest["model"]["llm"]
    graph = onnx.load(bundle / components["llm"]["artifact"])
    try:
        llm = llm_tensors(graph, onnx.load(bundle / components["embed"]["artifact"]), facts["num_layers"])
        quantized, quantization, why = (modelopt_state if fmt == "modelopt" else awq_state)(graph, facts["num_layers"])
    except NotExportable as exc:
        raise UserError(f"{bundle}: {exc}; mmtrt export hf cannot write this LLM") from None
    source = model.state_dict()
    extra = sorted(k for k in llm if k.endswith(".bias") and LLM_PREFIX + k not in source)
    if extra:
        raise UserError(f"{bundle}'s LLM adds biases a {facts['model_type']} config cannot hold ({extra[0]}; "
                        "channel_prune's bias_compensation writes them); compile with bias_compensation: false")
    state = {k: v for k, v in source.items() if not k.startswith(LLM_PREFIX) and k != "lm_head.weight"}
    written = {k: v for k, v in llm.items() if k.removesuffix(".weight") not in quantized} | {
        f"{module}.{suffix}": array for module, packed in quantized.items() for suffix, array in packed.items()}
    state |= {(k if k == "lm_head.weight" else LLM_PREFIX + k): torch.from_numpy(v.copy()) for k, v in written.items()}
    config = _sized_config(model.config, llm, facts["head_dim"])
    text = config.get_text_config()
    if tied(config) and not np.array_equal(llm["lm_head.weight"], llm["embed_tokens.weight"]):
        for c in {id(config): config, id(text): text}.values():  # a quantized lm_head is its own weight
            c.tie_word_embeddings = False
    family, hf_quant = manifest["model"]["architecture"], None
    if quantization is not None and fmt == "modelopt":
        from mmtrt.handoff.modelopt_w4a16 import exclude_names, quant_configs

        floats = quantization["floats"]
        hub_floats = [hub_name(family, LLM_PREFIX + m) for m in floats]
        hf_quant, config.quantization_config = quant_configs(
            quantization["group_size"], exclude_names(hub_floats, floats))
    elif quantization is not None:
        skipped = [hub_name(family, LLM_PREFIX + m) for m in quantization["modules_to_not_convert"]]
        skipped += float_towers(family, state)
        config.quantization_config = {**quantization, "modules_to_not_convert": skipped}
    listed = "exclude_modules" if fmt == "modelopt" else "modules_to_not_convert"
    reasons = "; ".join(sorted(set(why.values())))
    floats = [f"awq_int4: {len(why)} linears written in float ({listed}): {reasons}"] if why else []
    kind = None if quantization is None else ("modelopt" if fmt == "modelopt" else "awq")
    return state, config, kind, floats, hf_quant


def float_towers(family: str, state: dict) -> list[str]:
    """The top-level modules beside the LLM (vision tower, projector), which the folder holds in float: a loader
    quantizes every linear its list does not name (vLLM fails on the projector's float weight otherwise)."""
    names = (hub_name(family, k) for k in state if not k.startswith(LLM_PREFIX) and k != "lm_head.weight")
    return sorted({name.split(".", 1)[0] for name in names if "." in name})


def modelopt_state(graph, num_layers: int):
    """awq_state's answer for ModelOpt's W4A16_AWQ: (module -> tensors, {floats, group_size} or None, reasons)."""
    from mmtrt.handoff.modelopt_w4a16 import modelopt_state as state

    quantized, floats, group, why = state(graph, num_layers)
    return quantized, None if group is None else {"floats": floats, "group_size": group}, why


def _sized_config(source, llm: dict, head_dim: int):
    """The source's config with the LLM's sizes as the bundle's graphs have them (channel_prune narrows them)."""
    config = copy.deepcopy(source)
    text = config.get_text_config()
    text.vocab_size, text.hidden_size = llm["embed_tokens.weight"].shape
    text.intermediate_size = llm["layers.0.mlp.gate_proj.weight"].shape[0]
    text.num_attention_heads = llm["layers.0.self_attn.q_proj.weight"].shape[0] // head_dim
    text.num_key_value_heads = llm["layers.0.self_attn.k_proj.weight"].shape[0] // head_dim
    if getattr(text, "head_dim", None) is not None:
        text.head_dim = head_dim
    return config


def awq_state(graph, num_layers: int) -> tuple[dict[str, dict], dict | None, dict]:
    """The decoder modules written as AutoAWQ GEMM (module -> its tensors) and the quantization config, whose
    `modules_to_not_convert` lists the float ones (vLLM's fused names beside transformers')."""
    from mmtrt.handoff.awq_gemm import awq_tensors, float_reasons, int4_linears
    from mmtrt.handoff.llm_weights import HF_ROLE
    from mmtrt.handoff.trtllm_export import LAYER_ROLES

    int4 = {key: lin for key, lin in int4_linears(graph).items() if key[0] >= 0}
    if not int4:
        return {}, None, {}
    why = float_reasons(int4, num_layers, LAYER_ROLES)
    quantized = {f"layers.{layer}.{HF_ROLE[role]}": awq_tensors(lin) for (layer, role), lin in int4.items()
                 if (layer, role) not in why}
    floats = [f"layers.{layer}.{HF_ROLE[role]}" for layer, role in sorted(why)]
    fused = sorted({f"layers.{layer}.{HF_ROLE[role].rsplit('.', 1)[0]}.{VLLM_FUSED[role]}"
                    for layer, role in why if role in VLLM_FUSED})
    group = next(iter(int4.values()))["block"]
    return quantized, {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": group, "zero_point": True,
                       "modules_to_not_convert": [*floats, *fused]}, why


def _write(stage: Path, family: str, state: dict, config, model, processor) -> None:
    from safetensors.torch import save_file

    tensors = {hub_name(family, k): v.contiguous() for k, v in state.items()
               if not (tied(config) and k == "lm_head.weight")}
    save_file(dict(sorted(tensors.items())), str(stage / "model.safetensors"), metadata={"format": "pt"})
    config.dtype = "float32"
    config.architectures = [type(model).__name__]  # what vLLM and Auto classes pick the model class by
    config.save_pretrained(stage)
    model.generation_config.save_pretrained(stage)
    processor.save_pretrained(stage)
    processor.image_processor.save_pretrained(stage)  # preprocessor_config.json, which older readers look for


def tied(config) -> bool:
    """Whether lm_head is the embedding (Qwen2-VL's text config leaves the flag to the top-level config)."""
    return bool(getattr(config, "tie_word_embeddings", None) or getattr(config.get_text_config(), "__dict__", {}).get(
        "tie_word_embeddings"))


def not_expressed(manifest: dict) -> list[str]:
    """One line per pass of the bundle that a Hugging Face folder does not hold."""
    tokens = manifest["image_token_rules"].get("tokens_per_image")
    lines = []
    for record in manifest["passes"]:
        name, changes = record["pass"], record["changes"]
        if name == "token_prune":
            lines.append(f"token_prune: the folder's vision tower gives every image token, not the bundle's "
                         f"{tokens} per image; an engine fed the bundle's image features (image_embeds) gets the kept ones")
        elif name == "fuse_plugins":
            lines.append("fuse_plugins: the folder holds plain weights; mmtrt's TensorRT plugins stay in the bundle")
        elif name in WEIGHT_PASSES_ON_VISION and "vision" in changes:
            lines.append(f"{name} on the vision tower: the folder's vision tower and projector are the source "
                         "checkpoint's float weights")
    return lines


def model_card(manifest: dict, notes: list[str]) -> str:
    passes = [f"- `{p['pass']}` {p['config']}" for p in manifest["passes"]] or ["- (none)"]
    unsaid = [f"- {line}" for line in notes] or ["- nothing: every pass of the bundle is in these weights"]
    about = (f"Exported by `mmtrt export hf` from a bundle (mmtrt {manifest['mmtrt_version']}, its recipe's sha256 "
             f"{manifest['recipe_sha256'][:16]}). The LLM's weights are the bundle's graphs', after its passes; the "
             "vision tower, projector, config and processor are the source checkpoint's. Keys are in the Hugging "
             "Face Hub's layout: transformers and vLLM load the folder.")
    return "\n".join([f"# {manifest['model']['architecture']} compiled by mmtrt", "", about, "",
                      "## Passes the bundle ran", "", *passes, "", "## Not expressed in this folder", "", *unsaid, ""])
