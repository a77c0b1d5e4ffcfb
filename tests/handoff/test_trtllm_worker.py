"""The TensorRT-LLM worker (a process in TensorRT-LLM's own environment) and mmtrt's side of it: the real worker
process started with this interpreter, which cannot import tensorrt_llm and says so; the message framing both sides
use; the runtime's chunking of requests to the engine's max_batch_size, and what it sends an M-RoPE engine."""

import io
import sys

import numpy as np
import pytest

from mmtrt.handoff import trtllm_process
from mmtrt.handoff.trtllm_engines import probe_llm_target
from mmtrt.handoff.trtllm_process import ENV, TrtllmProcess, WorkerUnavailable, probe
from mmtrt.handoff.trtllm_worker import read_message, write_message
from mmtrt.runtime.batch import Prepared
from mmtrt.handoff.trtllm_runner import TrtllmLLM, mrope_cos_sin

IMAGE, VOCAB = 7, 100


def test_worker_without_tensorrt_llm_says_why():
    """The worker starts in this environment, fails its tensorrt_llm import and greets with the reason."""
    with pytest.raises(WorkerUnavailable) as err:
        TrtllmProcess(sys.executable)
    assert f"tensorrt_llm is not importable in {sys.executable} (ModuleNotFoundError" in str(err.value)
    assert ENV in str(err.value) and "numpy<2" in str(err.value)


def test_the_host_probe_reports_the_worker_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert "tensorrt_llm is not importable" in probe_llm_target()
    monkeypatch.setenv(ENV, "/nonexistent/python")
    assert probe_llm_target() == probe("/nonexistent/python")
    assert f"{ENV}=/nonexistent/python is not an executable" in probe_llm_target()


def test_build_command_uses_the_worker_environment(monkeypatch, tmp_path):
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    assert trtllm_process.build_executable(str(python)) == [str(python), "-m", "tensorrt_llm.commands.build"]
    (python.parent / "trtllm-build").write_text("")
    assert trtllm_process.build_executable(str(python)) == [str(python.parent / "trtllm-build")]


def test_messages_round_trip(rng):
    arrays = {"ids": rng.integers(0, 1000, 37).astype(np.int32), "empty": np.zeros((0, 5), np.float32),
              "table": rng.standard_normal((3, 70000)).astype(np.float16), "scalar": np.float32(2.5).reshape(())}
    pipe = io.BytesIO()
    write_message(pipe, {"op": "generate", "requests": 3}, arrays)
    write_message(pipe, {"ok": True})
    pipe.seek(0)
    header, back = read_message(pipe)
    assert header["op"] == "generate" and header["requests"] == 3 and list(back) == list(arrays)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype and back[name].shape == a.shape and (back[name] == a).all()
    assert read_message(pipe) == ({"ok": True, "arrays": []}, {})
    with pytest.raises(EOFError, match="the pipe closed"):
        read_message(pipe)
    pipe = io.BytesIO(pipe.getvalue()[:40])
    with pytest.raises(EOFError, match="mid-message"):
        read_message(pipe)


class RecordingWorker:
    """Stands for the worker process (mmtrt's own client, not TensorRT-LLM): answers `load` with an engine of
    max_batch_size 2 and `generate` with tokens it can check, and records each request."""

    def __init__(self, mrope=None):
        self.calls, self.mrope = [], mrope

    def call(self, op, arrays=None, **fields):
        self.calls.append((op, fields, arrays))
        if op == "load":
            return {"ok": True, "vocab_size": VOCAB, "max_batch_size": 2, "mrope": self.mrope}, {}
        n = fields["requests"]
        tokens = {f"tokens_{i}": np.array([int(arrays[f"ids_{i}"][0]), 1, 2], np.int32) for i in range(n)}
        return {"ok": True, "seconds": 0.5}, tokens


def prepared(index: int, rng) -> Prepared:
    ids = [index + 10, IMAGE, IMAGE, 3]
    return Prepared(index, ids, rng.standard_normal((1, len(ids), 8)).astype(np.float32), 2, {})


def test_requests_go_in_chunks_of_the_engines_max_batch_size(rng):
    worker = RecordingWorker()
    llm = TrtllmLLM("engine", {"runtime": {"max_tokens_in_paged_kv_cache": 64}},
                    {"image_token_id": IMAGE, "eos_token_ids": [2]}, worker)
    batch = [prepared(i, rng) for i in range(5)]
    done = llm.decode(batch)
    generates = [(fields, arrays) for op, fields, arrays in worker.calls if op == "generate"]
    assert [fields["requests"] for fields, _ in generates] == [2, 2, 1]
    assert sorted(done) == list(range(5))
    for i, seq in done.items():
        assert seq.tokens == [i + 10, 1]  # up to the first EOS (2), within its limit of 2
    first_table = generates[0][1]["table"]
    np.testing.assert_array_equal(first_table[1], batch[1].embeds[0][[1, 2]])  # the image rows of request 1
    assert generates[0][1]["ids_1"].tolist() == [11, VOCAB, VOCAB + 1, 3]
    assert not {"mrope_cos_sin", "mrope_deltas"} & set(generates[0][1])  # an engine without M-RoPE


def test_an_mrope_engine_gets_each_requests_cos_sin_and_rope_delta(rng):
    """Each request's cos/sin from its own three rows of positions (a plain prompt counts up on all three) and its
    rope delta, in request order within each chunk; an engine without M-RoPE gets neither (the test above)."""
    mrope = {"head_size": 4, "rotary_base": 100.0, "max_position_embeddings": 16, "mrope_section": [1, 0, 1]}
    worker = RecordingWorker(mrope)
    llm = TrtllmLLM("engine", {"runtime": {"max_tokens_in_paged_kv_cache": 64}},
                    {"image_token_id": IMAGE, "eos_token_ids": [2]}, worker)
    batch = [prepared(i, rng) for i in range(3)]
    batch[1].positions = np.array([[0, 1, 1, 3], [0, 1, 2, 3], [0, 1, 1, 3]])[:, None]
    batch[1].rope_delta = -1
    llm.decode(batch)
    generates = [arrays for op, _, arrays in worker.calls if op == "generate"]
    assert [a["mrope_deltas"].tolist() for a in generates] == [[[0], [-1]], [[0]]]
    sent = [row for a in generates for row in a["mrope_cos_sin"]]
    assert all(row.shape == (16 * 4,) and row.dtype == np.float32 for row in sent)
    counting = np.broadcast_to(np.arange(4), (3, 4))
    for row, positions in zip(sent, [counting, batch[1].positions[:, 0], counting]):
        np.testing.assert_array_equal(row, mrope_cos_sin(positions, mrope))
    assert not np.array_equal(sent[0], sent[1])
