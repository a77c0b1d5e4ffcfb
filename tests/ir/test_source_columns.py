"""A referenced weight widened a block of output channels at a time (how awq_int4 rounds a wide lm_head) gives the
columns of the whole weight, for the exporter's transposed view of a checkpoint tensor and for the tensor itself."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch

from mmtrt.ir import source_weights


def referenced(source: torch.Tensor, transpose: bool):
    """An initializer exported from a placeholder of `source` (transposed, as the exporter folds x @ W.T)."""
    with source_weights.kept():
        yield reference(source, transpose)


def reference(source: torch.Tensor, transpose: bool):
    """`referenced`'s initializer, in the compile's registry that is active."""
    held = source_weights.placeholder(source).numpy()
    value = ir.Value(name="w", const_value=ir.Tensor(held.T if transpose else held))
    model = ir.Model(ir.Graph([], [], nodes=[], initializers=[value]), ir_version=10)
    source_weights.refer(model)
    tensor = ir.serde.serialize_model(model).graph.initializer[0]
    assert source_weights.is_reference(tensor)
    return tensor


@pytest.mark.parametrize("transpose", [True, False])
def test_columns_of_a_reference_are_the_whole_weights_columns(transpose):
    source = torch.randn(300, 72).to(torch.bfloat16)
    whole = source.float().numpy()
    expected = whole.T if transpose else whole
    for tensor in referenced(source, transpose):
        np.testing.assert_array_equal(source_weights.array(tensor), expected)
        for columns in (slice(0, 7), slice(40, 72), slice(5, None)):
            got = source_weights.array(tensor, columns)
            assert got.flags.c_contiguous
            np.testing.assert_array_equal(got, expected[:, columns])


def test_joined_references_are_the_concatenation_of_their_weights():
    """fuse_projections joins q/k/v (gate/up) weights still in the source model by reference: the join's values,
    its columns and its rows a block at a time (as the bundle writer widens it) are np.concatenate's, and nothing is
    widened until then."""
    sources = [torch.randn(n, 48).to(torch.bfloat16) for n in (256, 192, 192)]
    expected = np.concatenate([s.float().numpy().T for s in sources], axis=1)
    with source_weights.kept():
        parts = [reference(s, transpose=True) for s in sources]
        inner = source_weights.joined(parts[1:], "kv")
        join = source_weights.joined([parts[0], inner], "qkv")
        assert source_weights.is_reference(join) and list(join.dims) == [48, 640]
        np.testing.assert_array_equal(source_weights.array(join), expected)
        for columns in (slice(0, 7), slice(250, 260), slice(400, None), slice(3, 3)):
            np.testing.assert_array_equal(source_weights.array(join, columns), expected[:, columns])
        widening = source_weights.tensor_data(join)
        assert len(widening) == expected.nbytes
        blocks = list(widening.blocks(5 * 640 * 4))
        assert len(blocks) == 10 and b"".join(bytes(b) for b in blocks) == expected.tobytes()
        mixed = source_weights.joined([parts[0], onnx.numpy_helper.from_array(expected[:, 256:], "kv")], "qkv")
        assert not source_weights.is_reference(mixed)
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(mixed), expected)
