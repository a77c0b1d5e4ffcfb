"""Backend assignment records why; profiles follow the envelope; inputs outside them are rejected."""

import pytest

from mmtrt.errors import UserError
from mmtrt.ir.graph import TensorSpec
from mmtrt.partition.assign import assign_backends
from mmtrt.partition.shapes import check_shape, plan_dims
from mmtrt.recipe import Envelope, PartitionPolicy

COMPONENTS = ["preprocess", "vision", "embed", "llm"]


def test_fallback_is_recorded_with_the_reason():
    def probe(backend):
        return None if backend in ("torchvision", "onnxruntime") else f"{backend} is not importable"

    parts = assign_backends(PartitionPolicy(), COMPONENTS, probe)
    assert parts["vision"]["preferred"] == "tensorrt" and parts["vision"]["chosen"] == "onnxruntime"
    assert "tensorrt is not importable" in parts["vision"]["reason"] and "fell back to onnxruntime" in parts["vision"]["reason"]
    assert parts["llm"]["reason"].count("not importable") == 2
    assert parts["preprocess"]["reason"] == "preferred backend, available"


def test_the_first_available_backend_wins():
    parts = assign_backends(PartitionPolicy(), COMPONENTS, lambda b: None)
    assert parts["vision"]["chosen"] == "tensorrt" and parts["llm"]["chosen"] == "tensorrt-llm"


def test_a_backend_that_cannot_run_a_component_is_skipped():
    policy = PartitionPolicy(vision=["tensorrt-llm", "onnxruntime"])
    parts = assign_backends(policy, COMPONENTS, lambda b: None)
    assert parts["vision"]["chosen"] == "onnxruntime" and "cannot run the vision" in parts["vision"]["reason"]


FACTS = {"vision": {"image_tokens": 64, "input_size": [64, 64]}, "llm": {"max_position_embeddings": 2048}}


def test_dims_derive_from_the_envelope():
    env = Envelope.model_validate({"prompt_tokens": {"min": 1, "opt": 20, "max": 100}, "max_new_tokens": 10,
                                   "batch": {"min": 1, "opt": 2, "max": 3}})
    dims = plan_dims(FACTS, env)
    assert dims["seq"] == {"min": 1, "opt": 1, "max": 164}
    assert dims["total"]["opt"] == dims["past"]["opt"] + dims["seq"]["opt"] == 85
    assert dims["total"]["max"] == 174 and dims["past"]["max"] == 173
    assert dims["batch"] == {"min": 1, "opt": 2, "max": 3}


def test_shapes_outside_the_profile_are_rejected():
    dims = plan_dims(FACTS, Envelope())
    spec = TensorSpec("inputs_embeds", "float32", ("batch", "seq", 128))
    check_shape("llm", spec, (1, 10, 128), dims)
    with pytest.raises(UserError, match="seq = 999 .*envelope.prompt_tokens"):
        check_shape("llm", spec, (1, 999, 128), dims)
    with pytest.raises(UserError, match="expects 128"):
        check_shape("llm", spec, (1, 10, 64), dims)
