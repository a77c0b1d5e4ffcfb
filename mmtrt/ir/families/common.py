"""What every family shares: the LLM's facts, the tokenizer assets, and the embed and llm components."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from mmtrt.ir import export
from mmtrt.ir.graph import Component, graph_io

COMPONENTS = ("preprocess", "vision", "embed", "llm")
# what every family's lowering gives: HF's stack of all vision hidden states, the LLM's cache as HF lays it out
FRONTEND_PROPERTIES = frozenset({"vision.hidden_state_stack", "llm.kv_cache.hf"})


def llm_facts(text) -> dict[str, Any]:
    """The decoder's sizes, from its text config."""
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return {
        "model_type": text.model_type,
        "num_layers": text.num_hidden_layers,
        "hidden_size": text.hidden_size,
        "num_heads": text.num_attention_heads,
        "num_kv_heads": text.num_key_value_heads,
        "head_dim": head_dim,
        "vocab_size": text.vocab_size,
        "max_position_embeddings": text.max_position_embeddings,
    }


def eos_token_ids(generation_config) -> list[int]:
    eos = generation_config.eos_token_id
    return sorted(eos if isinstance(eos, list) else [eos])


def tokenizer_assets(processor) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        processor.tokenizer.save_pretrained(tmp)
        return {f"tokenizer/{p.name}": p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}


def onnx_component(name: str, model) -> Component:
    return Component(name, graph_io(model, "inputs"), graph_io(model, "outputs"), onnx=model)


def language_components(model, llm: dict[str, Any]) -> dict[str, Component]:
    """The token embedding and the decoder (prefill and decode in one graph), exported."""
    return {
        "embed": onnx_component("embed", export.export_embedding(model)),
        "llm": onnx_component("llm", export.export_decoder(model, llm["num_layers"], llm["num_kv_heads"],
                                                           llm["head_dim"], llm["hidden_size"])),
    }
