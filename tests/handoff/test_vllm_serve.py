"""`mmtrt serve BUNDLE --llm vllm` driven by the real clients: mmtrt's vision side and front doors (the OpenAI
endpoint, streaming or not, and Triton's gRPC stream), vLLM's LLM on the checkpoint's folder; for a plain and a
token-pruned bundle, the greedy tokens of `mmtrt run`, alone and concurrently. One server (one vLLM engine) at a
time."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from builders import random_image
from hub_checkpoint import compile_plain_and_pruned, save_hub_llava
from mmtrt.cli import main
from mmtrt.runtime import load
from servers import Server, messages, solo, triton_stream
from vllm_worker import require_vllm

require_vllm()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_hub_llava(tmp_path_factory.mktemp("vllm-serve") / "hub")


@pytest.fixture(scope="module")
def bundles(folder):
    return compile_plain_and_pruned(folder)


@pytest.fixture(scope="module", params=["plain", "pruned"])
def served(request, bundles, folder, tmp_path_factory):
    allowed = tmp_path_factory.mktemp("allowed")
    s = Server(bundles[request.param], "--llm", "vllm", "--llm-folder", str(folder), "--max-batch", "4",
               "--allow-images", str(allowed))
    s.allowed, s.bundle, s.model = allowed, bundles[request.param], request.param
    yield s
    s.close()


def via_openai(client, body: dict, stream: bool):
    reply = client.chat.completions.create(model=body["model"], messages=body["messages"],
                                           max_tokens=body["max_tokens"], stream=stream)
    if not stream:
        return reply.choices[0].model_extra["token_ids"], reply.choices[0].message.content
    ids, text = [], ""
    for chunk in reply:
        for choice in chunk.choices:
            ids += choice.model_extra["token_ids"]
            text += choice.delta.content or ""
    return ids, text


def test_greedy_through_both_endpoints_equals_mmtrt_run(served, tmp_path, capsys, rng):
    image = served.allowed / "image.png"
    random_image(rng, int(rng.integers(40, 100)), int(rng.integers(40, 100))).save(image)
    prompt = "what is under the blue table"
    capsys.readouterr()  # the rng fixture's seed line
    assert main(["run", str(served.bundle), "--image", str(image), "--prompt", prompt, "--max-new-tokens", "20",
                 "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    body = {"model": served.model, "max_tokens": 20, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": str(image)}}, {"type": "text", "text": prompt}]}]}
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=120)
    for stream in (False, True):
        assert via_openai(client, body, stream) == (expected["token_ids"], expected["text"])
    [out] = triton_stream(served.grpc, served.model, [body])
    assert (out["token_ids"], out["text"], out["error"]) == (expected["token_ids"], expected["text"], "")


def test_concurrent_requests_each_get_their_solo_tokens(served, rng):
    pipe = load(served.bundle)
    words = ["red", "cat", "under", "the", "blue", "table"]
    bodies = [{"model": served.model, "max_tokens": int(rng.integers(4, 20)), "messages": messages(
        random_image(rng, int(rng.integers(30, 90)), int(rng.integers(30, 90))),
        " ".join(rng.choice(words, int(rng.integers(1, 8)))))} for _ in range(5)]
    expected = [solo(pipe, b).token_ids for b in bodies]
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=120)
    with ThreadPoolExecutor(5) as pool:
        got = list(pool.map(lambda b: via_openai(client, b, stream=True)[0], bodies))
    assert got == expected
    assert served.wait_idle(30)["mmtrt_running_requests"] == 0
