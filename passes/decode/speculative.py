"""speculative: write into the bundle which draft the runtime proposes with and how many tokens it may propose.

The full LLM verifies every drafted token in one call per step, so greedy output stays token for token what plain
decoding gives and sampling keeps its distribution (mmtrt/runtime/speculative.py); what a draft changes is how many
tokens each full forward yields. `prompt_lookup` needs no weights. The manifest's `model.speculative` carries the
configuration the runtime reads.
"""

from __future__ import annotations

from typing import Any

from mmtrt.ir.graph import ModelIR
from mmtrt.pipeline.pass_base import Pass
from passes.decode.speculative_config import SpeculativeConfig


class Speculative(Pass):
    name = "speculative"
    Config = SpeculativeConfig
    components = ("llm",)
    provides = frozenset({"speculative"})

    def plan_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        return {**facts, "speculative": draft_facts(self.config, facts["llm"])}

    def run(self, ir: ModelIR) -> dict:
        ir.config["speculative"] = runtime_config(self.config)
        return {"llm": draft_facts(self.config, ir.config["llm"])}


def runtime_config(config: SpeculativeConfig) -> dict[str, Any]:
    """What the runtime reads from the manifest's model.speculative."""
    keys = ("draft", "k", "max_ngram") if config.draft == "prompt_lookup" else ("draft", "k", "layers")
    return {key: getattr(config, key) for key in keys}


def draft_facts(config: SpeculativeConfig, llm: dict[str, Any]) -> dict[str, Any]:
    """The draft for `compile --plan`: what it is and what it adds to the bundle."""
    return {"draft": config.draft, "k": config.k, "draft_params": 0, "bundle_growth_bytes": 0,
            "what": f"prompt lookup of up to {config.max_ngram}-token suffixes, no weights"}
