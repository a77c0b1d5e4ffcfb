"""Lowering that follows the checkpoint's dtype writes the bytes the float32 lowering writes, and awq_int4 reads
the weights where they are.

The compiler loads a checkpoint in its own dtype and exports each component with its large weights left in the
source model (`source_weights.kept()`: the graphs refer to them, and the writer widens one at a time as it saves
each graph; the small tensors are widened to float32 for the component's export only). The reference is the
straightforward path: the whole model loaded as float32 by transformers, every component exported, saved by
`onnx.save_model` with its external data. Every family's tiny model is saved in bfloat16 (every bfloat16 is
exactly a float32), so all must agree to the byte, graph and weights.

awq_int4 folds and rounds one layer at a time from the kept weights: its graphs must be those it writes from the
same IR with every weight taken into memory first (as the runner does for other passes), to the byte, and the kept
run must leave no float copy of a quantized weight behind. So must the other passes that run on the kept weights:
int8_weights, and those that only rewrite the graph around them (kv_layout, fuse_skip_norm, an early-exit draft).
"""

import copy

import onnx
import pytest
import torch
import transformers

from builders import TINY_FAMILIES as BUILDERS
from mmtrt.bundle.writer import save_onnx
from mmtrt.ir import source_weights
from mmtrt.ir.families import family
from mmtrt.ir.frontend import fit_envelope, load_source, lower
from mmtrt.partition.placement import annotate
from mmtrt.recipe import Envelope, ModelSource, PartitionPolicy
from passes.decode.speculative import Speculative
from passes.fusion.fuse_skip_norm import FuseSkipNorm
from passes.kv.kv_layout import KvLayout
from passes.quant.awq_int4 import AwqInt4
from passes.quant.int8_weights import Int8Weights

AWQ = {"components": ["llm", "vision"], "embedding": "int8",
       "calibration": {"samples": 2, "text_windows": 1, "search_tokens": 64}}

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
def test_bfloat16_checkpoint_lowers_and_quantizes_to_the_float32_bytes(name, tmp_path):
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
    with source_weights.kept():
        ir = lower(own, own_processor)
        assert next(own.parameters()).dtype == torch.bfloat16  # small tensors widened for the export only
        references = [t.name for c in ir.onnx_components() for t in c.onnx.graph.initializer
                      if source_weights.is_reference(t)]
        assert references  # the large weights stayed in the source model until the save
        assert_same_files(streamed_files(ir, tmp_path / "kept"), expected)

        taken = copy.deepcopy(ir)
        for comp in taken.onnx_components():
            source_weights.materialize(comp.onnx)
        rewritten_kept = streamed_files(rewrite_graphs(copy.deepcopy(ir), kept=True), tmp_path / "rewritten_kept")
        rewritten_taken = streamed_files(rewrite_graphs(copy.deepcopy(taken), kept=False), tmp_path / "rewritten")
        assert_same_files(rewritten_kept, rewritten_taken)
        quantized_kept = streamed_files(awq_int4(ir, kept=True), tmp_path / "awq_kept")
        assert_same_files(quantized_kept, streamed_files(awq_int4(taken, kept=False), tmp_path / "awq_taken"))


def planned(ir) -> None:
    """Give `ir` the envelope and partition facts a pass reads, as compile gives them."""
    ir.config = fit_envelope(ir.config, Envelope())
    annotate(ir, PartitionPolicy())


def awq_int4(ir, kept: bool):
    """`ir` after awq_int4 on its LLM and vision tower; from kept weights, with no float copy of a weight left."""
    planned(ir)
    changes = AwqInt4(AwqInt4.Config.model_validate(AWQ)).run(ir)
    for name in ("llm", "vision"):
        assert changes[name]["linears_quantized"] > 0
        copies = [t.name for t in ir.components[name].onnx.graph.initializer if t.data_type == onnx.TensorProto.FLOAT
                  and len(t.dims) == 2 and t.dims[0] * t.dims[1] > source_weights.SMALL
                  and not source_weights.is_reference(t)]
        assert not (kept and copies), copies
    return ir


def rewrite_graphs(ir, kept: bool):
    """`ir` after the passes the runner hands the kept weights (`reads_source_weights`) besides awq_int4: an
    early-exit draft, INT8 linears (each weight widened as it is rounded), fused skip norms, a static KV cache."""
    planned(ir)
    int8 = Int8Weights(Int8Weights.Config(components=["vision", "llm"], activations="dynamic"))
    for p in (Speculative(Speculative.Config(draft="early_exit", layers=1)), int8, FuseSkipNorm(FuseSkipNorm.Config()),
              KvLayout(KvLayout.Config(layout="static"))):
        assert p.reads_source_weights
        p.run(ir)
    references = sum(source_weights.is_reference(t) for c in ir.onnx_components() for t in c.onnx.graph.initializer)
    assert (references > 0) == kept
    return ir


def assert_same_files(got, expected):
    assert sorted(got) == sorted(expected)
    assert any(f.endswith(".data") for f in got)
    for file in expected:
        assert got[file] == expected[file], file
