"""Hooks that run around every pass: verify the IR, time the pass, dump the graphs."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx

from mmtrt.bundle.writer import save_onnx
from mmtrt.errors import UserError
from mmtrt.ir import source_weights
from mmtrt.ir.graph import ModelIR, graph_io
from mmtrt.ir.proto import copy_fields
from mmtrt.pipeline.pass_base import Pass


DUMP_THRESHOLD = 1024  # onnx.save_model's size_threshold


class VerificationError(RuntimeError):
    """A pass left the IR broken: a bug in the pass, not in the user's input."""


class Instrument:
    def before(self, p: Pass, ir: ModelIR) -> None:
        pass

    def after(self, p: Pass, ir: ModelIR, report: dict) -> None:
        pass


def verify_ir(ir: ModelIR) -> None:
    """ONNX checker with shape inference on every graph, and every graph's I/O equal to its component contract."""
    for comp in ir.onnx_components():
        try:
            onnx.checker.check_model(_checkable(comp.onnx), full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
            raise VerificationError(f"component {comp.name}: {exc}") from exc
        for which, declared in (("inputs", comp.inputs), ("outputs", comp.outputs)):
            actual = graph_io(comp.onnx, which)
            if actual != declared:
                raise VerificationError(f"component {comp.name}: graph {which} {actual} differ from the contract {declared}")
    _check_links(ir)


def _checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` for the ONNX checker, which reads every initializer's bytes and serializes the model (2 GB at most):
    its referenced and large weights (as the export would have referred to) declared as graph inputs of the same
    type and shape instead, in a copy that holds none of them."""
    large = {t.name for t in model.graph.initializer
             if source_weights.is_reference(t) or int(np.prod(t.dims)) > source_weights.SMALL}
    if not large:
        return model
    copy = onnx.ModelProto()
    copy_fields(model, copy, skip="graph")
    copy_fields(model.graph, copy.graph, skip="initializer")
    copy.graph.initializer.extend(t for t in model.graph.initializer if t.name not in large)
    copy.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                            for t in model.graph.initializer if t.name in large)
    return copy


def _check_links(ir: ModelIR) -> None:
    """The tensors that flow between components must agree in dtype and in every fixed dimension."""
    comps = ir.components
    links = [(comps["preprocess"].outputs[0], comps["vision"].inputs[0]),
             (comps["vision"].outputs[0], comps["llm"].inputs[0]),
             (comps["embed"].outputs[0], comps["llm"].inputs[0])]
    for src, dst in links:
        fixed = [(a, b) for a, b in zip(src.shape[1:], dst.shape[1:]) if isinstance(a, int) and isinstance(b, int)]
        if src.dtype != dst.dtype or any(a != b for a, b in fixed) or len(src.shape) != len(dst.shape):
            raise VerificationError(f"{src.name} {src.dtype}{list(src.shape)} does not fit {dst.name} {dst.dtype}{list(dst.shape)}")


class Verify(Instrument):
    def after(self, p, ir, report):
        verify_ir(ir)


class Timer(Instrument):
    def before(self, p, ir):
        self._start = time.perf_counter()

    def after(self, p, ir, report):
        report["time_ms"] = round(1000 * (time.perf_counter() - self._start), 1)


def dump_folder(folder: Path) -> Path:
    """The --dump-ir folder, created now so that a bad path fails before the model is built."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--dump-ir {folder} is not a usable folder ({exc.strerror or exc}); name a folder") from None
    return folder


class Dump(Instrument):
    """Writes every ONNX graph after every pass, for debugging a pass, as `onnx.save_model` would with external
    data (a weight still in the source model included), leaving the live IR as it was."""

    def __init__(self, folder: Path):
        self.folder = dump_folder(folder)
        self.count = 0

    def after(self, p, ir, report):
        self.count += 1
        for comp in ir.onnx_components():
            out = self.folder / f"{self.count:02d}_{p.name}" / f"{comp.name}.onnx"
            out.parent.mkdir(parents=True, exist_ok=True)
            save_onnx(comp.onnx, out, DUMP_THRESHOLD)
