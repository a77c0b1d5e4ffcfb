"""TensorRT-LLM partition plan: the exact `trtllm-build` command for the LLM, its limits from the shape plan.

Flags as tensorrt_llm/commands/build.py defines them (NVIDIA/TensorRT-LLM): `--max_multimodal_len` is the alias
of `--max_prompt_embedding_table_size`, the room for image features (batch x image tokens, as the LLaVA example
sizes it); `--gemm_plugin auto` takes the checkpoint's dtype. The KV capacity per sequence is `--max_seq_len`;
the pool size is a runtime setting (KvCacheConfig max_tokens), recorded beside the command.

The checkpoint itself (config.json + rank0.safetensors) is W4A16_AWQ from the quantization path, or float
(partition/engine_plan.py writes it); a bundle without one says why instead of pretending the command can run.
`build_options` is what the engine depends on besides the checkpoint: the engine key digests it.
"""

from __future__ import annotations

from typing import Any

CHECKPOINT_DIR = "trtllm/checkpoint"
ENGINE_DIR = "trtllm/engine"
TIMING_CACHE = "trtllm/timing.cache"


def trtllm_plan(facts: dict[str, Any], dims: dict[str, dict[str, int]], has_checkpoint: bool,
                why_not: str | None = None) -> dict[str, Any]:
    batch, input_len, seq_len = dims["batch"]["max"], dims["seq"]["max"], dims["total"]["max"]
    limits = {
        "max_batch_size": batch,
        "max_input_len": input_len,
        "max_seq_len": seq_len,
        "max_multimodal_len": batch * facts["vision"]["image_tokens"],
        "max_num_tokens": batch * input_len,
    }
    paged = (facts.get("kv_cache") or {}).get("layout") == "paged"  # kv_layout's blocks and pool, from the plan
    pool_tokens = dims["num_slots"]["max"] if paged else batch * seq_len
    options = {**limits, "kv_cache_type": "paged",
               **({"tokens_per_block": facts["kv_cache"]["block_tokens"]} if paged else {}), "gemm_plugin": "auto"}
    command = [
        "trtllm-build", "--checkpoint_dir", f"BUNDLE/{CHECKPOINT_DIR}", "--output_dir", f"BUNDLE/{ENGINE_DIR}",
        *[f"--{k} {v}" for k, v in options.items()],
        f"--input_timing_cache BUNDLE/{TIMING_CACHE}", f"--output_timing_cache BUNDLE/{TIMING_CACHE}",
    ]
    return {
        "component": "llm",
        "checkpoint": CHECKPOINT_DIR if has_checkpoint else None,
        "checkpoint_missing": None if has_checkpoint else (
            f"this bundle has no TensorRT-LLM checkpoint ({why_not or 'none was written'}); the command is "
            "recorded for when it does"),
        "limits": limits,
        "build_options": options,
        "runtime": {"kv_cache_tokens_per_sequence": seq_len, "max_tokens_in_paged_kv_cache": pool_tokens},
        "command": " ".join(command),
    }
