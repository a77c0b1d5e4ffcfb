"""Lowering that follows the checkpoint's dtype writes the bytes the float32 lowering writes.

The compiler loads a checkpoint in its own dtype and exports each component with its large weights left in the
source model (`source_weights.kept()`: the graphs refer to them, and the writer widens one at a time as it saves
each graph); without `kept()`, one component at a time is widened to float32 for its export. The reference is the
straightforward path: the whole model loaded as float32 by transformers, every component exported, saved by
`onnx.save_model` with its external data. Every family's tiny model is saved in bfloat16 (every bfloat16 is
exactly a float32), so all must agree to the byte, graph and weights.
"""

import onnx
import pytest
import torch
import transformers

from mmtrt.bundle.writer import save_onnx
from mmtrt.ir import source_weights
from mmtrt.ir.families import family
from mmtrt.ir.frontend import load_source, lower
from mmtrt.recipe import ModelSource
from mmtrt.zoo import tiny_anyres
from mmtrt.zoo.tiny_llava import build_tiny_llava
from mmtrt.zoo.tiny_qwen2_vl import build_tiny_qwen2_vl

BUILDERS = {
    "llava": build_tiny_llava,
    "llava_next": tiny_anyres.build_tiny_llava_next,
    "llava_onevision": tiny_anyres.build_tiny_llava_onevision,
    "qwen2_vl": lambda: build_tiny_qwen2_vl("qwen2_vl"),
    "qwen2_5_vl": lambda: build_tiny_qwen2_vl("qwen2_5_vl"),
}


def reference_files(ir, folder):
    folder.mkdir()
    for comp in ir.onnx_components():
        copy = onnx.ModelProto()
        copy.CopyFrom(comp.onnx)
        onnx.save_model(copy, folder / f"{comp.name}.onnx", save_as_external_data=True,
                        all_tensors_to_one_file=True, location=f"{comp.name}.onnx.data", size_threshold=1024)
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def streamed_files(ir, folder):
    folder.mkdir()
    for comp in ir.onnx_components():
        save_onnx(comp.onnx, folder / f"{comp.name}.onnx", 1024)
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_bfloat16_checkpoint_lowers_to_the_float32_bytes(name, tmp_path):
    model, processor = BUILDERS[name]()
    checkpoint = tmp_path / "checkpoint"
    model.to(torch.bfloat16).save_pretrained(checkpoint)
    processor.save_pretrained(checkpoint)
    del model

    wide = getattr(transformers, family(name).MODEL_CLASS).from_pretrained(checkpoint, dtype=torch.float32).eval()
    expected = reference_files(lower(wide, processor), tmp_path / "reference")
    del wide

    own, own_processor = load_source(ModelSource(source="hf", path=str(checkpoint)), tmp_path,
                                      own_dtype=True)
    assert next(own.parameters()).dtype == torch.bfloat16
    ir = lower(own, own_processor)
    assert next(own.parameters()).dtype == torch.bfloat16  # each component widened for its export only
    assert_same_files(streamed_files(ir, tmp_path / "streamed"), expected)

    with source_weights.kept():
        ir = lower(own, own_processor)
        references = [t.name for c in ir.onnx_components() for t in c.onnx.graph.initializer
                      if source_weights.is_reference(t)]
        assert references  # the large weights stayed in the source model until the save
        assert_same_files(streamed_files(ir, tmp_path / "kept"), expected)


def assert_same_files(got, expected):
    assert sorted(got) == sorted(expected)
    assert any(f.endswith(".data") for f in got)
    for file in expected:
        assert got[file] == expected[file], file
