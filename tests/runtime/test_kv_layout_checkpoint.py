"""A kv_layout bundle gets the TensorRT-LLM checkpoint of its float LLM, tensor for tensor the one of the hf
bundle (which tests/handoff/test_trtllm_float_checkpoint.py checks against ONNX Runtime), and the build command
carries the layout's block size."""

import json

import numpy as np
import pytest

from builders import read_safetensors


@pytest.mark.parametrize("layout", ["tiny_static_bundle", "tiny_paged_bundle"])
def test_a_kv_layout_bundle_writes_the_hf_bundles_checkpoint(layout, tiny_bundle, request):
    bundle = request.getfixturevalue(layout)
    plan = json.loads((bundle / "manifest.json").read_text())["tensorrt_llm"]
    assert plan["checkpoint_missing"] is None, plan["checkpoint_missing"]
    ours, _ = read_safetensors(bundle / "trtllm" / "checkpoint" / "rank0.safetensors")
    theirs, _ = read_safetensors(tiny_bundle / "trtllm" / "checkpoint" / "rank0.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
    assert ("--tokens_per_block 16" in plan["command"]) == (layout == "tiny_paged_bundle")
