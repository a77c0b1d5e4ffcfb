"""The C++ runtime decodes a bundle compiled with a speculative draft one token per step: the Python runtime's greedy
tokens (with and without the draft), and one line on stderr saying the draft is not used."""

import pytest

from builders import random_image
from conftest import ROOT, compile_to
from cpp_harness import generate_cpp, needs_build, run_cpp
from mmtrt.runtime import load

pytestmark = needs_build
DRAFTS = {"early_exit_static": "  - speculative: {draft: early_exit, layers: 2, k: 4}\n  - kv_layout: {layout: static}\n",
          "prompt_lookup_hf": "  - speculative: {draft: prompt_lookup, k: 4}\n"}
PROMPT = "one two three one two three one two"


@pytest.fixture(scope="module", params=sorted(DRAFTS))
def speculative_bundle(request, tmp_path_factory):
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace("envelope:", DRAFTS[request.param] + "envelope:")
    return compile_to(tmp_path_factory.mktemp(f"tiny-{request.param}"), recipe, "spec.bundle")


def test_tokens_equal_python_with_and_without_the_draft(speculative_bundle, rng, tmp_path):
    image = tmp_path / "image.png"
    random_image(rng, 72, 56).save(image)
    pipe = load(speculative_bundle, threads=1, prefix_cache_mib=0)
    drafted = pipe.generate(image, PROMPT, 24)
    pipe.speculative = None
    plain = pipe.generate(image, PROMPT, 24)
    ours = generate_cpp(speculative_bundle, image, PROMPT, "--max-new-tokens", "24")
    assert ours["token_ids"] == plain.token_ids == drafted.token_ids
    assert "draft" in ours["fallbacks"]["speculative"] and "speculative" not in ours


def test_the_runtime_says_once_that_it_decodes_without_the_draft(speculative_bundle, rng, tmp_path):
    image = tmp_path / "image.png"
    random_image(rng, 64, 64).save(image)
    proc = run_cpp(speculative_bundle, image, PROMPT, "--max-new-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "draft" in line]
    draft = "early_exit" if "early_exit" in str(speculative_bundle) else "prompt_lookup"
    assert len(notes) == 1 and notes[0].startswith("mmtrt-run: note: ") and draft in notes[0], proc.stderr
