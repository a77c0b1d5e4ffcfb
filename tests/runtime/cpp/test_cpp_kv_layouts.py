"""The C++ runtime runs the static and paged KV layouts: the tokens and text of the Python runtime on the same
bundle and of the hf bundle, a cache reused across calls of one load, and the Python runtime's refusals."""

import json
import shutil

import pytest

from builders import random_image
from conftest import ROOT, compile_to
from cpp_harness import CApi, generate_cpp, needs_build, needs_library, run_cpp
from mmtrt.errors import UserError
from mmtrt.runtime import load

pytestmark = needs_build
# prompts of 107, 222 and 294 tokens with the image's 64 (the envelope: 320), so the 32 new tokens fill the cache
PROMPTS = ["What is in the picture?", "Describe the colours, then count the objects. " * 3,
           "red cat under the blue table. " * 7]


@pytest.fixture(scope="module", params=["tiny_static_bundle", "tiny_paged_bundle", "siglip_static_bundle"])
def layout(request):
    hf = "siglip_bundle" if request.param.startswith("siglip") else "tiny_bundle"
    return request.getfixturevalue(request.param), load(request.getfixturevalue(hf), threads=1)


def image_file(rng, folder, name="image.png"):
    path = folder / name
    random_image(rng, int(rng.integers(24, 140)), int(rng.integers(24, 140))).save(path)
    return path


@pytest.mark.parametrize("prompt", PROMPTS)
def test_tokens_and_text_equal_python_and_the_hf_bundle(layout, prompt, rng, tmp_path):
    bundle, hf = layout
    image = image_file(rng, tmp_path)
    ours = generate_cpp(bundle, image, prompt)  # the envelope's 32 new tokens
    same_bundle = load(bundle, threads=1).generate(image, prompt).to_json()
    grown = hf.generate(image, prompt).to_json()
    assert ours["token_ids"] == same_bundle["token_ids"] == grown["token_ids"]
    assert ours["text"] == same_bundle["text"] == grown["text"]
    assert ours["prompt_tokens"] == same_bundle["prompt_tokens"]
    assert ours["fallbacks"].keys() == same_bundle["fallbacks"].keys()
    assert ours["backends"] == {**same_bundle["backends"], "preprocess": "cpp"}


@needs_library
def test_one_load_serves_calls_of_any_length_in_turn(layout, rng, tmp_path):
    """The buffers outlive a call: a short request after a long one reads none of the long one's rows."""
    bundle, _ = layout
    images = [image_file(rng, tmp_path, f"{i}.png") for i in range(3)]
    calls = [(images[0], PROMPTS[2], 32), (images[1], PROMPTS[0], 5), (images[2], PROMPTS[1], 20)]
    api = CApi()
    status, handle = api.load(bundle)
    assert status == 0, api.error()
    try:
        for image, prompt, tokens in calls:
            status, ours = api.generate(handle, image, prompt, tokens)
            assert status == 0, api.error()
            assert ours["token_ids"] == generate_cpp(bundle, image, prompt, "--max-new-tokens", str(tokens))["token_ids"]
    finally:
        api.free(handle)


@pytest.fixture(scope="module")
def fp16_static_bundle(tmp_path_factory):
    recipe = (ROOT / "recipes" / "tiny-llava-fp16.yaml").read_text()
    return compile_to(tmp_path_factory.mktemp("fp16-static"),
                      recipe.replace("envelope:", "  - kv_layout: {layout: static}\nenvelope:"), "b")


def test_an_fp16_cache_gives_the_python_runtime_tokens(fp16_static_bundle, rng, tmp_path):
    """kv_layout after cast_precision: the buffers are fp16 (2 bytes an element), the LLM's I/O around them fp32."""
    assert json.loads((fp16_static_bundle / "manifest.json").read_text())["model"]["kv_cache"]["dtype"] == "float16"
    pipe = load(fp16_static_bundle, threads=1)
    for prompt in PROMPTS[:2]:
        image = image_file(rng, tmp_path)
        ours, theirs = generate_cpp(fp16_static_bundle, image, prompt), pipe.generate(image, prompt).to_json()
        assert ours["token_ids"] == theirs["token_ids"] and ours["text"] == theirs["text"]


def edited_copy(bundle, tmp_path, edit):
    copy = shutil.copytree(bundle, tmp_path / "copy.bundle")
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def one_line(proc) -> str:
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stderr)
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    return proc.stderr.strip().removeprefix("mmtrt-run: error: ")


def python_message(call) -> str:
    with pytest.raises(UserError) as info:
        call()
    return str(info.value)


def test_a_pool_too_small_for_the_request_is_refused_as_python_does(tiny_paged_bundle, rng, tmp_path):
    def small_pool(m):  # a smaller pool of the same blocks: the schema wants num_slots = pool_blocks x block_tokens
        m["dims"]["pool_blocks"].update(min=3, opt=3, max=3)
        m["dims"]["num_slots"].update(min=48, opt=48, max=48)

    copy = edited_copy(tiny_paged_bundle, tmp_path, small_pool)
    image = image_file(rng, tmp_path)
    message = one_line(run_cpp(copy, image, PROMPTS[0]))
    assert message.startswith("the request needs ") and "the bundle's pool holds 3;" in message
    assert message == python_message(lambda: load(copy).generate(image, PROMPTS[0]))


def test_a_bf16_cache_is_refused_as_python_does(tiny_static_bundle, rng, tmp_path):
    def bf16(m):  # the cache's type and the LLM's cache inputs alike, as a bf16 compile writes them
        m["model"]["kv_cache"].update(dtype="bfloat16")
        for t in m["components"]["llm"]["inputs"]:
            if t["name"].startswith("past."):
                t["dtype"] = "bfloat16"

    copy = edited_copy(tiny_static_bundle, tmp_path, bf16)
    message = one_line(run_cpp(copy, image_file(rng, tmp_path), "hi"))
    assert message.startswith("this bundle's KV cache is bfloat16")
    assert message == python_message(lambda: load(copy))


def test_an_unknown_layout_is_refused(tiny_static_bundle, rng, tmp_path):
    copy = edited_copy(tiny_static_bundle, tmp_path, lambda m: m["model"]["kv_cache"].update(layout="ring"))
    message = one_line(run_cpp(copy, image_file(rng, tmp_path), "hi"))
    assert 'model.kv_cache.layout must be one of static, paged, not "ring"' in message
    assert message == python_message(lambda: load(copy))
