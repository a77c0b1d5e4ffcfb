"""Shape planning: min/opt/max for every symbolic dimension of every partition, derived from the envelope."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mmtrt.errors import UserError
from mmtrt.ir.spec import TensorSpec

if TYPE_CHECKING:  # the runtime checks shapes without importing onnx, or the recipe schema (pydantic, yaml)
    from mmtrt.ir.graph import ModelIR
    from mmtrt.recipe import Envelope

# The recipe key that widens each dimension, for error messages.
DIM_SOURCES = {
    "height": "envelope.image", "width": "envelope.image", "batch": "envelope.batch",
    "num_images": "envelope.batch or envelope.image.max_tiles",
    "seq": "envelope.prompt_tokens", "past": "envelope.prompt_tokens and envelope.max_new_tokens",
    "total": "envelope.prompt_tokens and envelope.max_new_tokens",
    "capacity": "envelope.prompt_tokens and envelope.max_new_tokens",
    "max_blocks": "envelope.prompt_tokens and envelope.max_new_tokens", "new_tokens": "envelope.batch",
    "tokens": "max_pixels of the checkpoint's image processor", "patches": "max_pixels of the checkpoint's image processor",
}


def plan_dims(facts: dict[str, Any], env: Envelope) -> dict[str, dict[str, int]]:
    """The range of every named dimension: sequence lengths count the image tokens, the KV cache its capacity."""
    tokens = facts["vision"]["image_tokens"]
    seq_max = env.prompt_tokens.max + tokens
    capacity = seq_max + env.max_new_tokens
    limit = facts["llm"]["max_position_embeddings"]
    if capacity > limit:
        raise UserError(f"envelope needs a KV capacity of {capacity} tokens (prompt {env.prompt_tokens.max} + image "
                        f"{tokens} + new {env.max_new_tokens}) but the LLM has {limit} positions; lower "
                        "envelope.prompt_tokens.max or envelope.max_new_tokens")
    batch = env.batch.model_dump()
    opt_seq = env.prompt_tokens.opt + tokens
    side = max(facts["vision"]["input_size"])
    anyres = facts["vision"].get("anyres")  # the vision encoder then takes one image's tiles and its base at once
    tiles = {"min": 1, "opt": 1 + anyres["max_tiles"], "max": 1 + anyres["max_tiles"]} if anyres else batch
    dims = {
        # the user's file, before preprocessing: bounded only where the recipe says so (max null: unbounded)
        "height": {"min": env.image.min_side or 1, "opt": side, "max": env.image.max_side},
        "width": {"min": env.image.min_side or 1, "opt": side, "max": env.image.max_side},
        "num_images": tiles,
        "batch": batch,
        # opt is one consistent decode step (seq 1 after a typical prompt), the shape engines run most often
        "seq": {"min": 1, "opt": 1, "max": seq_max},
        "past": {"min": 0, "opt": opt_seq, "max": capacity - 1},
        "total": {"min": 1, "opt": opt_seq + 1, "max": capacity},
        "past + seq": {"min": 1, "opt": opt_seq + 1, "max": capacity},
    }
    dims.update(facts["vision"].get("dims", {}))  # a family's own vision dimensions (Qwen2-VL: tokens, patches)
    if "kv_cache" in facts:  # buffers are allocated once, at the envelope's capacity
        dims.update(_cache_dims(facts["kv_cache"], capacity, batch["max"], seq_max))
    return dims


def _cache_dims(kv: dict[str, Any], capacity: int, batch: int, seq_max: int) -> dict[str, dict[str, int]]:
    fixed = {"capacity": capacity}
    if kv["layout"] == "paged":
        per_sequence = -(-capacity // kv["block_tokens"])
        blocks = kv["pool_blocks"] or batch * per_sequence
        if blocks > batch * per_sequence:
            raise UserError(f"kv_layout.pool_blocks {blocks} is more than the envelope can ever use ({batch} sequences "
                            f"x {per_sequence} blocks = {batch * per_sequence}); leave it out for that, or widen the "
                            "envelope")
        fixed.update(num_slots=blocks * kv["block_tokens"], pool_blocks=blocks)
        return {**{k: {"min": v, "opt": v, "max": v} for k, v in fixed.items()},
                "max_blocks": {"min": 1, "opt": per_sequence, "max": per_sequence},
                "new_tokens": {"min": 1, "opt": 1, "max": batch * seq_max}}
    return {k: {"min": v, "opt": v, "max": v} for k, v in fixed.items()}


def _shape_at(spec: TensorSpec, dims: dict[str, dict[str, int]], point: str) -> list[int]:
    return [d if isinstance(d, int) else dims[d][point] for d in spec.shape]


def plan_profiles(ir: ModelIR, dims: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Per component, per input: the min/opt/max shapes an engine must accept (TensorRT's optimization profile)."""
    profiles = {}
    for comp in ir.components.values():
        profiles[comp.name] = {
            spec.name: {p: _shape_at(spec, dims, p) for p in ("min", "opt", "max")} for spec in comp.inputs
        }
    return profiles


def check_shape(component: str, spec: TensorSpec, shape: tuple[int, ...], dims: dict[str, dict[str, int]]) -> None:
    """Reject an input outside the planned profile, naming the dimension and the recipe key that widens it."""
    for declared, actual in zip(spec.shape, shape):
        if isinstance(declared, int):
            if declared != actual:
                raise UserError(f"{component}.{spec.name} has size {actual} where the bundle expects {declared}")
            continue
        lo, hi = dims[declared]["min"], dims[declared]["max"]
        if not lo <= actual <= hi:
            raise UserError(f"{component}.{spec.name}: {declared} = {actual} is outside the bundle's profile "
                            f"[{lo}, {hi}]; recompile with a wider {DIM_SOURCES.get(declared, 'envelope')}")
