"""`mmtrt compile --plan` for a person: what would be built, in a dozen lines (`--json` has every number)."""

from __future__ import annotations

import json
from typing import Any

from mmtrt.partition.needs import needs


def describe_plan(plan, recipe_path: str, bundle: str) -> str:
    """The model, the passes with the options the recipe sets, a backend per component, the envelope and the
    shapes it gives, and the command that builds it."""
    data = plan.to_json()
    lines = [f"{recipe_path}: valid; nothing was built (--plan)",
             f"model       {_source(data['model'])}: {_facts(plan.facts)}"]
    lines += _passes(plan, data)
    lines += _backends(data["partitions"])
    lines.append(f"envelope    {_envelope(data['envelope'])}")
    dims = data["dims_after_passes"]
    lines.append(f"shapes      {data['image_tokens_after_passes']} image tokens per image; sequences up to "
                 f"{dims['seq']['max']} tokens; KV cache up to {dims['total']['max']} positions")
    if plan.passes.facts_after.get("speculative"):
        lines.append(f"speculative {_speculative(plan.passes.facts_after['speculative'])}")
    lines.append(f"next: mmtrt compile {recipe_path} -o {bundle}")
    return "\n".join(lines)


def _source(model: dict[str, Any]) -> str:
    return f"zoo:{model['name']}" if model["source"] == "zoo" else str(model["path"])


def _facts(facts: dict[str, Any]) -> str:
    v, t = facts["vision"], facts["llm"]
    return (f"{v['model_type']} {v['input_size'][0]}x{v['input_size'][1]}/{v['patch_size']}, {v['image_tokens']} image "
            f"tokens; {t['model_type']} {t['num_layers']} layers, hidden {t['hidden_size']}, {t['num_heads']} heads / "
            f"{t['num_kv_heads']} KV heads")


def _passes(plan, data: dict[str, Any]) -> list[str]:
    if not plan.passes.passes:
        return ["passes      (none)"]
    rows = []
    for i, p in enumerate(plan.passes.passes):
        options = p.config.model_dump(exclude_defaults=True)
        text = f"{p.name} {json.dumps(options)}" if options else p.name
        lossy = ", lossy" if p.lossy else ""
        rows.append(f"{i + 1}. {text}  (on {', '.join(p.components)}{lossy})")
    before, after = data["image_tokens_before_passes"], data["image_tokens_after_passes"]
    if before != after:
        rows.append(f"image tokens per image: {before} -> {after}")
    return ["passes      " + rows[0]] + [" " * 12 + row for row in rows[1:]]


def _speculative(draft: dict[str, Any]) -> str:
    growth = "" if draft["bundle_growth_bytes"] is None else f"; the bundle grows by {draft['bundle_growth_bytes']:,} bytes"
    return f"draft {draft['draft']} ({draft['what']}), up to {draft['k']} tokens per step{growth}"


def _backends(partitions: dict[str, Any]) -> list[str]:
    """A line per partition: the first backend of its recipe list that can run it, and what that needs where."""
    rows = [f"{name} {p['planned']}: {needs(p['planned'])}" for name, p in partitions.items()]
    return ["backends    " + rows[0]] + [" " * 12 + row for row in rows[1:]]


def _envelope(envelope: dict[str, Any]) -> str:
    b, p = envelope["batch"], envelope["prompt_tokens"]
    return (f"batch {b['min']}..{b['max']}; prompts of {p['min']}..{p['max']} tokens (tuned for {p['opt']}); up to "
            f"{envelope['max_new_tokens']} new tokens")
