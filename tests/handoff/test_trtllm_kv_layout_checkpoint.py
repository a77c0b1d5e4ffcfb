"""A kv_layout bundle that opts in to TensorRT-LLM gets the TensorRT-LLM checkpoint of its float LLM, tensor for
tensor the one of the plain layout's bundle (which tests/handoff/test_trtllm_float_checkpoint.py checks against
ONNX Runtime), and the build command carries the layout's block size."""

import json

import numpy as np
import pytest
from builders import read_safetensors
from conftest import ROOT, TRTLLM_OPT_IN, compile_to

LAYOUTS = {"static": "  - kv_layout: {layout: static}\n", "paged": "  - kv_layout: {layout: paged, block_tokens: 16}\n"}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_kv_layout_bundle_writes_the_plain_bundles_checkpoint(layout, tiny_trtllm_bundle, tmp_path):
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace("envelope:", LAYOUTS[layout] + "envelope:")
    bundle = compile_to(tmp_path, recipe + TRTLLM_OPT_IN)
    plan = json.loads((bundle / "manifest.json").read_text())["tensorrt_llm"]
    assert plan["checkpoint_missing"] is None, plan["checkpoint_missing"]
    ours, _ = read_safetensors(bundle / "trtllm" / "checkpoint" / "rank0.safetensors")
    theirs, _ = read_safetensors(tiny_trtllm_bundle / "trtllm" / "checkpoint" / "rank0.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
    assert ("--tokens_per_block 16" in plan["command"]) == (layout == "paged")
