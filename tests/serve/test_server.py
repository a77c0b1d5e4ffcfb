"""`mmtrt serve` driven by the real clients (the official `openai` package, `tritonclient`): the tokens of a solo
run through both endpoints, seeds, concurrent mixed requests, bad requests, a client that disconnects mid-stream;
and every KV block free afterwards. One server for the module (the tiny model, paged KV layout, Triton on)."""

from __future__ import annotations

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import openai
import pytest

from builders import assert_same_up_to_near_ties, random_image
from mmtrt.cli import main
from mmtrt.runtime import load
from servers import Server, messages, solo, triton_stream

MODEL = "paged"  # the bundle folder is paged.bundle
WORDS = ["red", "cat", "under", "the", "blue", "table", "near", "a", "window"]


@pytest.fixture(scope="module")
def server(tiny_paged_bundle, tmp_path_factory):
    allowed = tmp_path_factory.mktemp("allowed")
    s = Server(tiny_paged_bundle, "--max-batch", "4", "--max-queue", "32", "--allow-images", str(allowed))
    s.allowed = allowed
    yield s
    s.close()


@pytest.fixture(scope="module")
def pipe(tiny_paged_bundle):
    return load(tiny_paged_bundle)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def body(rng, max_tokens=None, image=True, **sampling):
    text = " ".join(rng.choice(WORDS, int(rng.integers(1, 30))))
    image = random_image(rng, int(rng.integers(20, 120)), int(rng.integers(20, 120))) if image else None
    return {"model": MODEL, "messages": messages(image, text),
            "max_tokens": int(max_tokens or rng.integers(2, 33)), **sampling}


def via_openai(client, b: dict, stream: bool):
    kwargs = {k: v for k, v in b.items() if k not in ("model", "messages", "max_tokens")}
    extra = {k: kwargs.pop(k) for k in ("top_k", "repetition_penalty") if k in kwargs}
    reply = client.chat.completions.create(model=b["model"], messages=b["messages"], max_tokens=b["max_tokens"],
                                           stream=stream, extra_body=extra or None, **kwargs)
    if not stream:
        choice = reply.choices[0]
        return choice.model_extra["token_ids"], choice.message.content, choice.finish_reason
    ids, text, reason = [], "", None
    for chunk in reply:
        for choice in chunk.choices:
            ids += choice.model_extra["token_ids"]
            text += choice.delta.content or ""
            reason = choice.finish_reason or reason
    return ids, text, reason


def test_models_lists_the_bundle_and_triton_is_ready(server, client):
    import tritonclient.grpc as grpcclient

    assert [m.id for m in client.models.list()] == [MODEL]
    triton = grpcclient.InferenceServerClient(server.grpc)
    assert triton.is_server_ready() and triton.is_model_ready(MODEL)
    assert triton.get_model_config(MODEL).config.model_transaction_policy.decoupled


def test_greedy_through_both_endpoints_equals_mmtrt_run(server, client, tiny_paged_bundle, tmp_path, capsys):
    image = tmp_path / "image.png"
    random_image(__import__("numpy").random.default_rng(), 64, 96).save(image)
    prompt = "what is under the blue table"
    assert main(["run", str(tiny_paged_bundle), "--image", str(image), "--prompt", prompt,
                 "--max-new-tokens", "24", "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    (server.allowed / "image.png").write_bytes(image.read_bytes())
    b = {"model": MODEL, "max_tokens": 24, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": str(server.allowed / "image.png")}},
        {"type": "text", "text": prompt}]}]}
    for stream in (False, True):
        ids, text, reason = via_openai(client, b, stream)
        assert (ids, text, reason) == (expected["token_ids"], expected["text"], expected["finish_reason"])
    [out] = triton_stream(server.grpc, MODEL, [b])
    assert (out["token_ids"], out["text"], out["error"]) == (expected["token_ids"], expected["text"], "")
    assert server.wait_idle()["mmtrt_kv_blocks_used"] == 0
    triton_metrics = urllib.request.urlopen(server.triton_metrics, timeout=30).read().decode()
    assert re.search(r'nv_inference_request_success\{model="paged",version="1"\} [1-9]', triton_metrics)


def test_a_seed_gives_the_same_tokens_twice(client, pipe, rng):
    b = body(rng, 24, temperature=0.9, top_p=0.95, top_k=50, seed=int(rng.integers(2**63)))
    first = via_openai(client, b, stream=True)
    assert via_openai(client, b, stream=False) == first
    assert first[0] == solo(pipe, b).token_ids


def test_concurrent_mixed_requests_each_get_their_solo_tokens(server, client, pipe, rng):
    bodies = [body(rng, image=i % 4 != 3) for i in range(10)]
    bodies[1].update(temperature=0.7, seed=11)
    bodies[2].update(repetition_penalty=1.3)
    bodies[5].update(stop=["e"])
    with ThreadPoolExecutor(8) as pool:
        openai_runs = [pool.submit(via_openai, client, b, i % 2 == 0) for i, b in enumerate(bodies[:7])]
        triton_runs = pool.submit(triton_stream, server.grpc, MODEL, bodies[7:])
        got = [f.result()[0] for f in openai_runs] + [r["token_ids"] for r in triton_runs.result()]
    assert len({len(ids) for ids in got}) > 1
    for b, ids in zip(bodies, got):
        reference = solo(pipe, b)
        assert_same_up_to_near_ties(SimpleNamespace(token_ids=ids), reference)
    m = server.wait_idle()
    assert m["mmtrt_kv_blocks_used"] == 0 and m["mmtrt_kv_blocks_total"] > 0


def bad_requests(server, rng):
    good = body(rng, 4)
    outside = server.allowed.parent / "outside.png"
    random_image(rng, 32, 32).save(outside)

    def with_image(url):
        return {**good, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]}]}

    return {
        "not valid JSON": b'{"model": "paged", "messages": [',
        "not served here": json.dumps({**good, "model": "other"}).encode(),
        "cannot read image": json.dumps(with_image("data:image/png;base64,aGVsbG8gd29ybGQ=")).encode(),
        "tokens after the chat template": json.dumps({**good, "messages": messages(None, "cat " * 400)}).encode(),
        "top_p": json.dumps({**good, "top_p": 0}).encode(),
        "temperature": json.dumps({**good, "temperature": -1}).encode(),
        "max_new_tokens": json.dumps({**good, "max_tokens": 10_000}).encode(),
        "never fetches": json.dumps(with_image("http://example.com/cat.png")).encode(),
        "not a file in this server's image folder": json.dumps(with_image(str(outside))).encode(),
        "not supported": json.dumps({**good, "tools": []}).encode(),
    }


def test_bad_requests_get_one_line_400s_and_disturb_nothing(server, client, pipe, rng):
    running = body(rng, 32)
    with ThreadPoolExecutor(2) as pool:
        alongside = pool.submit(via_openai, client, running, True)
        for expected, data in bad_requests(server, rng).items():
            status, answer = server.post("/chat/completions", data)
            message = answer["error"]["message"]
            assert status == 400 and expected in message and "\n" not in message, (expected, status, answer)
        assert alongside.result()[0] == solo(pipe, running).token_ids
    [out] = triton_stream(server.grpc, MODEL, [{"messages": "not a list", "max_tokens": 4}])
    assert out["finish_reason"] == "error" and "messages must be" in out["error"] and out["token_ids"] == []
    assert server.wait_idle()["mmtrt_kv_blocks_used"] == 0


def test_a_client_that_disconnects_mid_stream_frees_its_blocks(server, client, pipe, rng):
    b = next(c for c in (body(rng, 32) for _ in range(20)) if solo(pipe, c).finish_reason == "length")
    before = server.metrics()["mmtrt_tokens_generated_total"]
    stream = client.chat.completions.create(model=MODEL, messages=b["messages"], max_tokens=32, stream=True)
    assert next(iter(stream)).choices[0].delta.role == "assistant"  # sent as the request is queued
    stream.close()
    m = server.wait_idle(timeout=5)
    assert m["mmtrt_kv_blocks_used"] == 0 and m["mmtrt_running_requests"] == 0
    assert m["mmtrt_tokens_generated_total"] - before < 32  # cancelled, not run to its limit
