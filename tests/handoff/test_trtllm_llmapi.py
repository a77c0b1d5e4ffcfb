"""TensorRT-LLM's LLM API side, as far as it runs without TensorRT-LLM: the requests built for its precomputed
multimodal embeddings (the text prompt with one image token per image, which TensorRT-LLM's LLaVA input processor
tokenizes and expands to the embeddings' rows; the embeddings as the exported folder's own vision tower and
projector compute them in transformers), and the worker's greeting where tensorrt_llm does not import."""

import io
import subprocess
import sys

import numpy as np
import pytest
import torch
from builders import random_image

from mmtrt.errors import UserError
from mmtrt.handoff.hf_export import export_hf
from mmtrt.handoff.trtllm_llmapi import WORKER, LlmApiRunner, build_request, collapse_image_runs
from mmtrt.handoff.worker_framing import read_message
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request

PROMPT = "What is in the picture?"


@pytest.fixture(scope="module")
def folder(tiny_bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("llmapi") / "hf"
    export_hf(tiny_bundle, out)
    return out


def test_a_request_carries_the_prompt_as_text_with_one_image_token_and_the_images_embeddings(tiny_bundle, folder,
                                                                                              rng):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    pipe = load(tiny_bundle, threads=1)
    processor = AutoProcessor.from_pretrained(folder)
    image = random_image(rng, 44, 60)
    header, arrays = build_request(pipe, processor.tokenizer, image, PROMPT, max_new_tokens=5)
    assert header["max_new_tokens"] == 5 and list(arrays) == ["image_0"]
    token, count = pipe.model["image_token_id"], pipe.model["vision"]["image_tokens"]
    ids = processor.tokenizer(header["prompt"]).input_ids  # as TensorRT-LLM's input processor tokenizes it
    assert ids.count(token) == 1
    at = ids.index(token)
    assert ids[:at] + [token] * count + ids[at + 1:] == pipe.check(0, _request(image)).ids
    model = LlavaForConditionalGeneration.from_pretrained(folder).eval()
    pixels = processor(images=image, text="<image>", return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        features = model.get_image_features(pixel_values=pixels)
    hidden = model.config.text_config.hidden_size
    want = _rows(features, hidden).numpy()
    assert arrays["image_0"].shape == (count, hidden)
    np.testing.assert_allclose(arrays["image_0"], want, rtol=1e-4, atol=1e-4)


def _rows(features, hidden: int) -> torch.Tensor:
    """get_image_features' answer (a tensor, a list of them, or an output holding them) as [rows, hidden]."""
    if torch.is_tensor(features):
        return features.reshape(-1, hidden)
    if hasattr(features, "pooler_output"):
        return _rows(features.pooler_output, hidden)
    return torch.cat([_rows(f, hidden) for f in features])


def _request(image):
    return Request(image, PROMPT, 5)


def test_each_image_run_collapses_to_one_token():
    assert collapse_image_runs([1, 9, 9, 9, 2, 9, 9, 3], 9) == [1, 9, 2, 9, 3]
    assert collapse_image_runs([9, 9], 9) == [9]


def test_the_worker_greets_with_the_reason_where_tensorrt_llm_does_not_import():
    done = subprocess.run([sys.executable, str(WORKER)], input=b"", capture_output=True, timeout=60, check=False)
    assert done.returncode == 0
    greeting, _ = read_message(io.BytesIO(done.stdout))
    assert greeting["ok"] is False
    assert "tensorrt_llm is not importable" in greeting["error"] and "MMTRT_TRTLLM_PYTHON" in greeting["error"]
    assert "\n" not in greeting["error"]


def test_the_runner_refuses_in_one_line_without_tensorrt_llm(tiny_bundle, folder):
    with pytest.raises(UserError) as err:
        LlmApiRunner(tiny_bundle, folder, python=sys.executable)
    assert "tensorrt_llm is not importable" in str(err.value) and "\n" not in str(err.value)
