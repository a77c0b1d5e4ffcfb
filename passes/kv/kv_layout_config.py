"""The options of `kv_layout`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mmtrt.pipeline.pass_config import PassConfig


class KvLayoutConfig(PassConfig):
    layout: Literal["static", "paged"] = Field("static", description="`static`: one buffer per layer `[batch, H_kv, capacity, D]` (capacity = prompt + image tokens + max new tokens), past and present bound to the same memory and written in place. `paged`: one pool of blocks per layer `[num_slots, H_kv, D]` and a block table per sequence (vLLM, TensorRT-LLM), so a sequence holds only the blocks it fills.")
    block_tokens: int = Field(16, ge=1, le=1024, description="`paged` only: tokens per block, a power of two (TensorRT-LLM's XQA kernels take 64 or 128).")
    cache_dtype: Literal["auto", "fp32", "fp16", "bf16"] = Field("auto", description="The type the cache is stored in. `auto`: the type the LLM computes keys and values in (fp16 when kv_layout follows an fp16 cast_precision, whose casts at the cache I/O go; fp32 otherwise). `fp16` on an fp32 LLM halves KV memory; the graph casts the new keys and values on the way in (static: attention itself runs in fp16; paged: the gathered context is cast back for attention). A bf16 cache (`bf16`, or `auto` after a bf16 cast_precision) is refused at plan time: ONNX Runtime's CPU GroupQueryAttention has no bfloat16 kernel.")
    pool_blocks: int | None = Field(None, ge=1, description="`paged` only: blocks in the pool. Default: enough for the envelope's batch maximum at full capacity; fewer make requests wait for blocks.")

    @model_validator(mode="after")
    def _consistent(self) -> "KvLayoutConfig":
        if self.block_tokens & (self.block_tokens - 1):
            raise ValueError(f"block_tokens {self.block_tokens} is not a power of two; use 16, 32, 64 or 128")
        paged_only = sorted({"block_tokens", "pool_blocks"} & self.model_fields_set)
        if self.layout == "static" and paged_only:
            raise ValueError(f"{' and '.join(paged_only)} apply to layout: paged only; set layout: paged or drop them")
        return self
