"""vLLM (in its own environment, on the CPU) as the LLM of a tiny LLaVA: fed with transformers' own image features
it gives transformers' greedy tokens; behind a plain and a token-pruned bundle's vision side it gives `mmtrt run`'s
greedy tokens, and vLLM's own prompt holds the kept count of image tokens. One vLLM engine for the module, shared by
both bundles (token pruning leaves the LLM as it is)."""

from __future__ import annotations

import pytest

from builders import random_image
from hub_checkpoint import PRUNED_TOKENS, compile_plain_and_pruned, save_hub_llava
from mmtrt.handoff.vllm_pipeline import load as load_vllm
from mmtrt.handoff.vllm_scheduler import collapse_image_runs
from mmtrt.runtime import SamplingParams, load
from vllm_worker import require_vllm, worker  # noqa: F401 (worker: the module's vLLM process)

require_vllm()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_hub_llava(tmp_path_factory.mktemp("vllm-hub") / "hub")


@pytest.fixture(scope="module")
def bundles(folder):
    return compile_plain_and_pruned(folder)


@pytest.fixture(scope="module")
def pipes(worker, bundles, folder):
    return {name: load_vllm(bundles[name], folder, engine=worker) for name in ("plain", "pruned")}


def engine_tokens(engine, ids, features, max_tokens, eos) -> list[int]:
    """A request straight to the worker: its tokens once it finishes."""
    import queue

    messages: queue.SimpleQueue = queue.SimpleQueue()
    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, "repetition_penalty": 1.0}
    engine.submit(engine.new_id(), ids, {"image_embeds": features}, sampling, max_tokens, eos, messages.put)
    tokens = []
    while True:
        message = messages.get(timeout=120)
        tokens += message["tokens"]
        if message["finish_reason"]:
            assert message["finish_reason"] in ("stop", "length"), message
            return tokens


def test_vllm_on_the_folder_gives_transformers_greedy_tokens(folder, pipes, rng):
    import torch
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    text = processor.apply_chat_template([{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "what is in the picture"}]}], add_generation_prompt=True)
    inputs = processor(images=random_image(rng, 72, 56), text=text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
        features = model.get_image_features(inputs["pixel_values"]).pooler_output
    expected = out[0, inputs["input_ids"].shape[1]:].tolist()
    features = torch.stack(list(features)) if isinstance(features, (list, tuple)) else features
    ids = collapse_image_runs(inputs["input_ids"][0].tolist(), model.config.image_token_id)
    assert ids.count(model.config.image_token_id) == 1
    got = engine_tokens(pipes["plain"].engine, ids, features.numpy(), 20, [model.generation_config.eos_token_id])
    assert got == expected


@pytest.mark.parametrize("name", ["plain", "pruned"])
def test_greedy_equals_mmtrt_run_and_vllm_sees_the_bundles_image_tokens(name, bundles, pipes, rng):
    image = random_image(rng, int(rng.integers(40, 100)), int(rng.integers(40, 100)))
    expected = load(bundles[name]).generate(image, "describe the colours", max_new_tokens=24)
    got = pipes[name].generate(image, "describe the colours", max_new_tokens=24)
    assert (got.token_ids, got.text, got.finish_reason) == (expected.token_ids, expected.text, expected.finish_reason)
    # counted in the prompt vLLM expanded from one placeholder and the embeddings it was handed
    assert (got.prompt_tokens, got.image_tokens) == (expected.prompt_tokens, expected.image_tokens)
    assert got.image_tokens == (PRUNED_TOKENS if name == "pruned" else 64)
    assert got.backends["llm"].startswith("vllm 0.32")
    assert set(pipes[name].runners) == {"vision"}  # vLLM runs the LLM: its ONNX sessions are never loaded


def test_batch_decodes_together_and_each_gets_its_solo_tokens(bundles, pipes, rng):
    from mmtrt.runtime import Request

    images = [random_image(rng, int(rng.integers(30, 90)), int(rng.integers(30, 90))) for _ in range(3)]
    prompts = ["a", "what colour is it", "count the shapes please"]
    solo = [pipes["pruned"].generate(i, p, max_new_tokens=16).token_ids for i, p in zip(images, prompts)]
    batch = pipes["pruned"].generate_batch([Request(i, p, 16) for i, p in zip(images, prompts)])
    assert [g.token_ids for g in batch] == solo


def test_sampling_top_k_1_is_greedy_and_a_seed_repeats(pipes, rng):
    image = random_image(rng, 64, 64)
    greedy = pipes["pruned"].generate(image, "tell me", max_new_tokens=16).token_ids
    top1 = SamplingParams(temperature=0.8, top_k=1, seed=int(rng.integers(2**31)))
    assert pipes["pruned"].generate(image, "tell me", sampling=top1).token_ids[:16] == greedy[:16]
    seeded = SamplingParams(max_new_tokens=16, temperature=1.5, top_p=0.95, seed=int(rng.integers(2**31)))
    first = pipes["pruned"].generate(image, "tell me", sampling=seeded).token_ids
    assert pipes["pruned"].generate(image, "tell me", sampling=seeded).token_ids == first


def test_stream_adds_up_to_generate_and_cuts_at_a_stop_string(pipes, rng):
    image = random_image(rng, 50, 70)
    whole = pipes["plain"].generate(image, "go on", max_new_tokens=24)
    deltas = list(pipes["plain"].stream(image, "go on", max_new_tokens=24))
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids
    assert "".join(d.text for d in deltas) == whole.text and deltas[-1].finish_reason == whole.finish_reason
    visible = whole.text.strip()
    if len(visible) < 4:
        pytest.skip(f"the greedy text {whole.text!r} is too short to hold a stop string")
    stop = visible[len(visible) // 2:len(visible) // 2 + 2]
    cut = pipes["plain"].generate(image, "go on", sampling=SamplingParams(max_new_tokens=24, stop=(stop,)))
    assert cut.text == whole.text[:whole.text.index(stop)] and cut.finish_reason == "stop"
