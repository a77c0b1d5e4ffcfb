"""The export captures each module with torch.export's non-strict capture, trying a failed capture once more; where
it still fails, the strict fallback (which copies every weight in float32) is said in one line with its cause."""

import numpy as np
import onnx
import torch
from onnx.reference import ReferenceEvaluator

from mmtrt.ir.export import _export


class Flaky(torch.nn.Module):
    """A linear whose capture fails its first `failures` times outside dynamo, or always with `dynamo_only`."""

    def __init__(self, failures=0, dynamo_only=False):
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        left = [failures]  # outside the module: export puts the module's attributes back as they were

        def fails() -> bool:
            left[0] -= 1
            return dynamo_only or left[0] >= 0
        self.fails = fails

    def forward(self, x):
        if not torch.compiler.is_dynamo_compiling() and self.fails():
            raise RuntimeError("not capturable without dynamo")
        return self.linear(x)


def _exported(module, rng, capsys):
    x = torch.from_numpy(rng.normal(size=(3, 8)).astype(np.float32))
    model = _export(module.eval(), (x,), None, ["x"], ["y"])
    got = ReferenceEvaluator(model).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, module.linear(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    return model, capsys.readouterr().err


def test_a_capture_that_fails_once_is_tried_again(rng, capsys):
    model, err = _exported(Flaky(failures=1), rng, capsys)
    assert err == "" and isinstance(model, onnx.ModelProto)


def test_a_capture_that_needs_dynamo_says_so_and_exports(rng, capsys):
    _, err = _exported(Flaky(dynamo_only=True), rng, capsys)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: torch.export could not capture Flaky without dynamo")
    assert "not capturable without dynamo" in lines[0] and "float32" in lines[0]
