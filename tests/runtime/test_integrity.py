"""An edited manifest is one line naming the field, never a traceback or a quietly different answer; the bundle
holds only listed, hashed files inside it; its digest can be pinned and its signature required."""

import json
import os
import shutil

import pytest

from builders import random_image
from mmtrt.cli import main
from mmtrt.errors import UserError
from mmtrt.runtime import load


def edited(bundle, tmp_path, edit, name="edited.bundle"):
    copy = shutil.copytree(bundle, tmp_path / name, symlinks=True)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def refusal(bundle) -> str:
    with pytest.raises(UserError) as info:
        load(bundle, threads=1)
    message = str(info.value)
    assert "\n" not in message
    return message


def _set(path, value):
    def edit(m):
        *parents, last = path.split(".")
        node = m
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is KeyError:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value
    return edit


@pytest.mark.parametrize("path, value, words", [
    ("model.vision.image_tokens", 63, "model.vision.image_tokens is 63 but the vision output holds 64"),
    ("model.image_token_id", KeyError, "model.image_token_id is missing"),
    ("envelope.max_new_tokens", "32", 'envelope.max_new_tokens must be an integer from 1 to 1048576, not "32"'),
    ("model.image_token", "<ima\u0000ge>", "model.image_token must be a non-empty name"),
    ("components.llm.inputs.0.name", "inputs\u0000embeds", "components.llm.inputs[0].name must be a non-empty name"),
    ("model.eos_token_ids", [999], "lies outside the vocabulary"),
    ("model.llm.num_layers", 3, "model.llm.num_layers is 3 but the LLM takes 8 past tensors"),
    ("model.llm.head_dim", 16, "model.llm.head_dim is 16 but the LLM's past.0.key has 32"),
    ("dims.seq.max", -1, "dims.seq.max must be an integer from 0"),
    ("components.vision.artifact", "../vision.onnx", "components.vision.artifact must be a relative path inside"),
])
def test_edits_of_the_manifest_are_one_line_naming_the_field(tiny_bundle, tmp_path, path, value, words):
    assert words in refusal(edited(tiny_bundle, tmp_path, _set(path, value)))


@pytest.mark.parametrize("path, value, words", [
    ("model.kv_cache.block_tokens", 8, "must be dims.pool_blocks (88) x model.kv_cache.block_tokens (8)"),
    ("model.kv_cache.block_tokens", 0, "model.kv_cache.block_tokens must be an integer from 1 to 1024, not 0"),
    ("model.kv_cache.layout", "ring", "model.kv_cache.layout must be one of static, paged"),
    ("model.kv_cache.dtype", "float16", "model.kv_cache.dtype is float16 but the LLM's cache inputs are float32"),
    ("model.kv_cache.past", "past.{layer}", "model.kv_cache.past must name {layer} and {kind}"),
    ("dims.capacity.max", 10**9, "dims.capacity (1000000000) exceeds the LLM's positions (2048"),
])
def test_edits_of_the_kv_cache_facts(tiny_paged_bundle, tmp_path, path, value, words):
    assert words in refusal(edited(tiny_paged_bundle, tmp_path, _set(path, value)))


def test_an_artifact_dropped_from_the_list_is_refused(tiny_bundle, tmp_path, capsys):
    """Drop llm.onnx.data from `artifacts` and change it: neither `verify` nor a load may accept it."""
    bundle = edited(tiny_bundle, tmp_path, lambda m: m["artifacts"].pop("llm.onnx.data"))
    with open(bundle / "llm.onnx.data", "r+b") as f:
        f.seek(1000)
        f.write(b"\x7f")
    assert "components.llm reads llm.onnx.data, which artifacts does not list" in refusal(bundle)
    assert main(["verify", str(bundle)]) == 2
    assert "llm.onnx.data" in capsys.readouterr().err


def test_a_file_the_manifest_does_not_list_is_refused(tiny_bundle, tmp_path):
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    (bundle / "tokenizer" / "added_tokens.json").write_text("{}")  # the C++ tokenizer would read it
    assert "holds tokenizer/added_tokens.json, which manifest.json does not list" in refusal(bundle)


def test_symlinks_out_of_the_bundle_and_loops_are_refused(tiny_bundle, tmp_path):
    outside = shutil.copytree(tiny_bundle, tmp_path / "outside")
    bundle = shutil.copytree(tiny_bundle, tmp_path / "b")
    (bundle / "preprocess.json").unlink()
    os.symlink(outside / "preprocess.json", bundle / "preprocess.json")
    assert "preprocess.json leads outside the bundle" in refusal(bundle)
    (bundle / "preprocess.json").unlink()
    os.symlink("preprocess.json", bundle / "preprocess.json")
    assert "preprocess.json cannot be resolved" in refusal(bundle)


def test_the_digest_is_printed_and_pinned(tiny_bundle, tmp_path, capsys, rng):
    assert main(["inspect", str(tiny_bundle)]) == 0
    digest = next(w for w in capsys.readouterr().out.split() if w.startswith("sha256:"))
    assert load(tiny_bundle, expect_digest=digest).hash == digest.removeprefix("sha256:")
    other = edited(tiny_bundle, tmp_path, lambda m: m["envelope"].update(max_new_tokens=31))
    with pytest.raises(UserError, match="not the expected sha256:"):
        load(other, expect_digest=digest)
    image = tmp_path / "i.png"
    random_image(rng, 40, 40).save(image)
    assert main(["run", str(other), "--image", str(image), "--prompt", "hi", "--expect-digest", digest]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_compile_prints_the_digest(tiny_bundle, tmp_path, capsys, monkeypatch):
    from conftest import ROOT

    monkeypatch.setattr("mmtrt.compiler.compile_recipe", lambda recipe, out, **kw: tiny_bundle)
    recipe = tmp_path / "recipe.yaml"  # the CLI checks the recipe before it compiles
    recipe.write_text((ROOT / "recipes" / "tiny-llava.yaml").read_text())
    assert main(["compile", str(recipe), "-o", str(tmp_path / "x")]) == 0
    from mmtrt.bundle.manifest import sha256_file

    assert f"digest sha256:{sha256_file(tiny_bundle / 'manifest.json')}" in capsys.readouterr().out


def test_a_pool_larger_than_the_envelope_can_use_is_refused_at_compile(tmp_path, capsys):
    from conftest import ROOT

    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace(
        "envelope:", "  - kv_layout: {layout: paged, pool_blocks: 1000000000000}\nenvelope:")
    (tmp_path / "r.yaml").write_text(recipe)
    assert main(["compile", str(tmp_path / "r.yaml"), "--plan"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pool_blocks 1000000000000 is more than the envelope can ever use" in err
