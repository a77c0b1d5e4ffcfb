"""speculative: write into the bundle which draft the runtime proposes with and how many tokens it may propose.

The full LLM verifies every drafted token in one call per step, so greedy output stays token for token what plain
decoding gives and sampling keeps its distribution (mmtrt/runtime/speculative.py); what a draft changes is how many
tokens each full forward yields. `prompt_lookup` needs no weights. `early_exit` adds a component `draft`, the LLM's
first layers with its final norm and lm_head (early_exit_graph.py), whose weights are the LLM's own in the bundle,
and optionally an exit adapter trained here on calibration data (exit_adapter.py; its report is the pass's
`changes.llm.adapter`, its time the build report's `pass_times_ms`).
The manifest's `model.speculative` carries the configuration the runtime reads.
"""

from __future__ import annotations

from typing import Any

from mmtrt.errors import UserError
from mmtrt.ir.graph import ModelIR
from mmtrt.pipeline.pass_base import Pass
from passes.decode.early_exit_graph import cut_early_exit, rms_norms
from passes.decode.speculative_config import SpeculativeConfig

DRAFT = "draft"


class Speculative(Pass):
    name = "speculative"
    Config = SpeculativeConfig
    components = ("llm",)
    provides = frozenset({"speculative"})
    reads_source_weights = True  # the draft's graph points at the LLM's weights; the adapter reads them as sources

    def plan_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        if self.config.draft == "early_exit" and facts.get("kv_cache"):
            raise UserError("draft early_exit is cut from the LLM's graph before its KV layout is rewritten; put "
                            "speculative before kv_layout")
        return {**facts, "speculative": draft_facts(self.config, facts["llm"])}

    def run(self, ir: ModelIR) -> dict:
        cfg = self.config
        ir.config["speculative"] = runtime_config(cfg)
        facts = draft_facts(cfg, ir.config["llm"])
        if cfg.draft == "early_exit":
            llm, num_layers = ir.components["llm"], ir.config["llm"]["num_layers"]
            adapter = None
            if cfg.adapter is not None:
                from passes.decode.exit_adapter import train

                *adapter, facts["adapter"] = train(ir, rms_norms(llm.onnx, num_layers), cfg.layers, cfg.adapter)
            draft = cut_early_exit(llm, num_layers, cfg.layers, DRAFT, adapter)
            ir.components[DRAFT] = draft
            ir.config["speculative"]["component"] = DRAFT
            facts.update(draft_nodes=draft.node_count(), draft_params=draft.param_count(),
                         llm_params=llm.param_count())
        return {"llm": facts}


def runtime_config(config: SpeculativeConfig) -> dict[str, Any]:
    """What the runtime reads from the manifest's model.speculative."""
    keys = ("draft", "k", "max_ngram") if config.draft == "prompt_lookup" else ("draft", "k", "layers")
    return {key: getattr(config, key) for key in keys}


def draft_facts(config: SpeculativeConfig, llm: dict[str, Any]) -> dict[str, Any]:
    """The draft for `compile --plan`: what it is and what it adds to the bundle (early_exit's exact parameters and
    graph size are in the compile's pass report)."""
    if config.draft == "prompt_lookup":
        return {"draft": config.draft, "k": config.k, "draft_params": 0, "bundle_growth_bytes": 0,
                "what": f"prompt lookup of up to {config.max_ngram}-token suffixes, no weights"}
    if config.layers >= llm["num_layers"]:
        raise UserError(f"speculative: layers {config.layers} must be fewer than the LLM's {llm['num_layers']} "
                        f"decoder layers; pick 1..{llm['num_layers'] - 1}")
    layers = (f"the first {config.layers} of {llm['num_layers']} decoder layers ({config.layers / llm['num_layers']:.0%}"
              " of the layers' parameters)")
    if config.adapter is None:
        return {"draft": config.draft, "k": config.k, "draft_params": None, "bundle_growth_bytes": None,
                "what": f"{layers}, final norm and lm_head; its weights are the LLM's own in the bundle, which grows "
                        "by the draft's graph file only"}
    hidden, a = llm["hidden_size"], config.adapter
    params = hidden * hidden + hidden
    return {"draft": config.draft, "k": config.k, "draft_params": None, "adapter_params": params,
            "bundle_growth_bytes": None,
            "what": f"{layers}, an exit adapter of {params:,} parameters ({4 * params:,} bytes in float32, trained at "
                    f"compile time: {a.steps} steps of {a.batch_tokens} positions on {a.data.text_windows} windows of "
                    f"{a.data.text} text), then the LLM's final norm and lm_head; the layers' weights are the LLM's "
                    "own in the bundle, which grows by the adapter and the draft's graph file"}
