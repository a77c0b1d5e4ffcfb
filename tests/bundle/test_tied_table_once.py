"""A tied embedding / lm_head table is stored once in the bundle (the lm_head reads the embed's table through a
Transpose), the bundle decodes what transformers and a bundle written with two copies decode, and only bytes that
are equal are shared: an untied model, or a table a pass changed, keeps its own copy."""

import json
from types import SimpleNamespace

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

from builders import assert_same_up_to_near_ties, hf_greedy, hf_prefill_logits, make_model, random_image, tensor
from mmtrt.bundle.stored import StoredTensors
from mmtrt.bundle.verify import verify_bundle
from mmtrt.bundle.writer import save_onnx
from mmtrt.ir import source_weights
from mmtrt.runtime import load

NEW_TOKENS = 6
PROMPTS = ["What is in the picture?", "Describe the colours."]


@pytest.fixture(scope="module")
def tied(anyres_compile):
    return anyres_compile("llava_onevision", "", "tied.bundle")


@pytest.fixture(scope="module")
def two_copies(anyres_compile):
    """The same recipe written as before sharing: the lm_head's own transposed copy of the table."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StoredTensors, "transposed", lambda self, tensor, raw: None)
        return anyres_compile("llava_onevision", "", "two-copies.bundle")


def table_bytes(bundle) -> tuple[bytes, bytes]:
    """The embed's table and its transpose, as bytes."""
    table = numpy_helper.to_array(next(t for t in onnx.load(bundle / "embed.onnx").graph.initializer))
    return table.tobytes(), np.ascontiguousarray(table.T).tobytes()


def copies(bundle, raw: bytes) -> int:
    return sum(p.read_bytes().count(raw) for p in bundle.rglob("*") if p.is_file())


def test_the_tied_table_is_in_the_bundle_once(tied, two_copies):
    table, transposed = table_bytes(tied)
    assert (copies(tied, table), copies(tied, transposed)) == (1, 0)
    assert (copies(two_copies, table), copies(two_copies, transposed)) == (1, 1)
    saved = (two_copies / "llm.onnx.data").stat().st_size - (tied / "llm.onnx.data").stat().st_size
    assert saved == len(table)
    llm = json.loads((tied / "manifest.json").read_text())["components"]["llm"]
    assert "embed.onnx.data" in llm["files"]
    verify_bundle(tied, json.loads((tied / "manifest.json").read_text()), full=True)


def test_the_tied_bundle_decodes_what_transformers_and_two_copies_decode(tied, two_copies, anyres_checkpoints, rng):
    import transformers

    folder = anyres_checkpoints["llava_onevision"]
    model = transformers.LlavaOnevisionForConditionalGeneration.from_pretrained(folder).eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    ours, reference = load(tied), load(two_copies)
    for prompt in PROMPTS:
        image = random_image(rng, int(rng.integers(1, 120)), int(rng.integers(1, 120)))
        hf_logits = hf_prefill_logits(model, processor, image, prompt)
        _, hf_tokens, margins = hf_greedy(model, processor, image, prompt, NEW_TOKENS)
        ids, features = ours.encode_image(image, ours.prompt_ids(prompt))
        embeds = ours.embed(np.array([ids], np.int64), features)
        logits, _ = ours.step(embeds, ours.empty_cache())
        assert np.array_equal(logits, reference.step(embeds, reference.empty_cache())[0])
        assert np.abs(logits[0] - hf_logits).max() <= 1e-3
        hf = SimpleNamespace(token_ids=hf_tokens, margins=margins)
        generated = ours.generate(image, prompt, max_new_tokens=NEW_TOKENS)
        assert_same_up_to_near_ties(generated, hf)
        assert generated.token_ids == reference.generate(image, prompt, max_new_tokens=NEW_TOKENS).token_ids


def test_the_same_recipe_writes_the_same_bytes(tied, anyres_compile):
    again = anyres_compile("llava_onevision", "", "tied-again.bundle")
    artifacts = [json.loads((b / "manifest.json").read_text())["artifacts"] for b in (tied, again)]
    assert artifacts[0] == artifacts[1]


def test_an_untied_model_keeps_its_own_lm_head(tiny_bundle):
    llm = onnx.load(tiny_bundle / "llm.onnx", load_external_data=False)
    assert not any(n.op_type == "Transpose" and n.name.endswith("tied_transpose") for n in llm.graph.node)
    assert "embed.onnx.data" not in json.loads((tiny_bundle / "manifest.json").read_text())["components"]["llm"]["files"]


def _pair(table: np.ndarray, head: np.ndarray) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """An embed graph gathering from `table` and an llm graph multiplying by `head`."""
    embed = make_model([onnx.helper.make_node("Gather", ["table", "ids"], ["x"])],
                       [tensor("ids", [2], onnx.TensorProto.INT64)],
                       [tensor("x", [2, table.shape[1]], onnx.helper.np_dtype_to_tensor_dtype(table.dtype))],
                       [("table", table)])
    dtype = onnx.helper.np_dtype_to_tensor_dtype(head.dtype)
    llm = make_model([onnx.helper.make_node("MatMul", ["h", "head"], ["logits"])],
                     [tensor("h", [3, head.shape[0]], dtype)], [tensor("logits", [3, head.shape[1]], dtype)],
                     [("head", head)])
    return embed, llm


def _save_pair(folder, table: np.ndarray, head: np.ndarray, llm_stored=None) -> onnx.ModelProto:
    """`_pair` saved with one registry (the llm with `llm_stored` where given); the llm as saved (external data
    not loaded)."""
    embed, llm = _pair(table, head)
    stored = StoredTensors(folder)
    save_onnx(embed, folder / "embed.onnx", 64, stored, table=True)
    save_onnx(llm, folder / "llm.onnx", 64, stored if llm_stored is None else llm_stored)
    return onnx.load(folder / "llm.onnx", load_external_data=False)


def _locations(model: onnx.ModelProto) -> set[str]:
    return {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_transposed_table_is_shared_and_computes_the_same_logits(tmp_path, rng, dtype):
    table = rng.normal(size=(50, 16)).astype(dtype)
    llm = _save_pair(tmp_path, table, np.ascontiguousarray(table.T))
    assert _locations(llm) == {"embed.onnx.data"}
    assert not (tmp_path / "llm.onnx.data").exists()
    untied = tmp_path / "untied"
    untied.mkdir()
    _save_pair(untied, table, np.ascontiguousarray(table.T), StoredTensors(untied))
    h = rng.normal(size=(3, 16)).astype(dtype)
    logits = [ort.InferenceSession(str(f / "llm.onnx")).run(None, {"h": h})[0] for f in (tmp_path, untied)]
    np.testing.assert_array_equal(*logits)


def test_a_table_in_the_same_layout_is_shared_without_a_transpose(tmp_path, rng):
    table = rng.normal(size=(16, 16)).astype(np.float32)
    llm = _save_pair(tmp_path, table, table.copy())
    assert _locations(llm) == {"embed.onnx.data"}
    assert not any(n.op_type == "Transpose" for n in llm.graph.node)


def test_a_table_a_pass_changed_is_not_shared(tmp_path, rng):
    table = rng.normal(size=(50, 16)).astype(np.float32)
    head = np.ascontiguousarray(table.T)
    head[3, 7] = np.nextafter(head[3, 7], np.float32(np.inf))
    llm = _save_pair(tmp_path, table, head)
    assert _locations(llm) == {"llm.onnx.data"}
    assert not any(n.op_type == "Transpose" for n in llm.graph.node)



def _referring(model: onnx.ModelProto, source: torch.Tensor, transpose: bool) -> onnx.ModelProto:
    """`model` with its one initializer exported from a placeholder of `source` (its transpose where asked): a
    reference to the checkpoint's tensor, as a compile's export leaves it."""
    lowered = ir.serde.deserialize_model(model)
    held = source_weights.placeholder(source).numpy()
    next(iter(lowered.graph.initializers.values())).const_value = ir.Tensor(held.T if transpose else held)
    source_weights.refer(lowered)
    out = ir.serde.serialize_model(lowered)
    assert source_weights.is_reference(out.graph.initializer[0])
    return out


def test_a_referenced_table_is_written_and_shared_a_block_of_rows_at_a_time(tmp_path, rng, monkeypatch):
    """A checkpoint's bf16 table widened to float32 a few rows at a time (blocks that split the saved file's blocks
    unevenly) gives onnx's bytes, and is still found again whole and as the lm_head's transpose."""
    monkeypatch.setattr(source_weights, "BLOCK", 1000)
    source = torch.from_numpy(rng.normal(size=(301, 40)).astype(np.float32)).to(torch.bfloat16)
    table = source.float().numpy()
    embed, llm = _pair(table, np.ascontiguousarray(table.T))
    stored = StoredTensors(tmp_path)
    with source_weights.kept():
        save_onnx(_referring(embed, source, False), tmp_path / "embed.onnx", 64, stored, table=True)
        save_onnx(_referring(llm, source, True), tmp_path / "llm.onnx", 64, stored)
        save_onnx(_referring(embed, source, False), tmp_path / "again.onnx", 64, stored)
    assert (tmp_path / "embed.onnx.data").read_bytes() == table.tobytes()
    assert not (tmp_path / "llm.onnx.data").exists() and not (tmp_path / "again.onnx.data").exists()
    for name in ("llm", "again"):
        assert _locations(onnx.load(tmp_path / f"{name}.onnx", load_external_data=False)) == {"embed.onnx.data"}
    h, ids = rng.normal(size=(3, 40)).astype(np.float32), rng.integers(0, 301, size=2)
    logits = ort.InferenceSession(str(tmp_path / "llm.onnx")).run(None, {"h": h})[0]
    np.testing.assert_allclose(logits, h @ table.T, rtol=1e-5, atol=1e-5)
    rows = ort.InferenceSession(str(tmp_path / "again.onnx")).run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(rows, table[ids])
