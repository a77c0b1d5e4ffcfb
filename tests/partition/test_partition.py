"""Backend assignment records why; profiles follow the envelope; inputs outside them are rejected."""

import pytest

from mmtrt.errors import UserError
from mmtrt.ir.graph import TensorSpec
from mmtrt.partition.assign import assign_backends
from mmtrt.partition.shapes import check_shape, plan_dims
from mmtrt.recipe import Envelope, PartitionPolicy

COMPONENTS = ["preprocess", "vision", "embed", "llm"]


def test_the_plan_is_the_first_capable_backend():
    parts = assign_backends(PartitionPolicy(), COMPONENTS)
    assert parts["vision"]["planned"] == "tensorrt" and parts["llm"]["planned"] == "tensorrt"
    assert parts["preprocess"]["reason"] == "first backend listed"
    assert all("host" not in p["reason"] and "importable" not in p["reason"] for p in parts.values())


def test_a_backend_that_cannot_run_a_component_is_skipped():
    policy = PartitionPolicy(vision=["tensorrt-llm", "onnxruntime"])
    parts = assign_backends(policy, COMPONENTS)
    assert parts["vision"]["planned"] == "onnxruntime"
    assert parts["vision"]["reason"] == "tensorrt-llm: cannot run the vision component; planned onnxruntime"
    with pytest.raises(UserError, match="partition.embed .*use onnxruntime or tensorrt"):
        assign_backends(PartitionPolicy(embed=["tensorrt-llm"]), COMPONENTS)


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
