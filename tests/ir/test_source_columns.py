"""A referenced weight widened a block of output channels at a time (how awq_int4 rounds a wide lm_head) gives the
columns of the whole weight, for the exporter's transposed view of a checkpoint tensor and for the tensor itself."""

import numpy as np
import onnx_ir as ir
import pytest
import torch

from mmtrt.ir import source_weights


def referenced(source: torch.Tensor, transpose: bool):
    """An initializer exported from a placeholder of `source` (transposed, as the exporter folds x @ W.T)."""
    with source_weights.kept():
        held = source_weights.placeholder(source).numpy()
        value = ir.Value(name="w", const_value=ir.Tensor(held.T if transpose else held))
        model = ir.Model(ir.Graph([], [], nodes=[], initializers=[value]), ir_version=10)
        source_weights.refer(model)
        tensor = ir.serde.serialize_model(model).graph.initializer[0]
        assert source_weights.is_reference(tensor)
        yield tensor


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
