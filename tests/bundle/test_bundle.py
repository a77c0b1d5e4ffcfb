"""Bundles are reproducible, self-describing, and never half-written."""

import pytest

from mmtrt.bundle.manifest import read_manifest, sha256_file, verify_artifacts
from mmtrt.compiler import compile_recipe
from mmtrt.errors import UserError

from conftest import ROOT


@pytest.mark.exports  # the export is part of what must repeat
def test_same_recipe_gives_identical_bundles(tiny_bundle, tmp_path):
    again = compile_recipe(ROOT / "recipes" / "tiny-llava.yaml", tmp_path / "again")
    first, second = read_manifest(tiny_bundle), read_manifest(again)
    assert first["artifacts"] == second["artifacts"]
    assert sha256_file(tiny_bundle / "manifest.json") == sha256_file(again / "manifest.json")


def test_manifest_lists_every_file_with_its_hash(tiny_bundle):
    manifest = read_manifest(tiny_bundle)
    files = {p.relative_to(tiny_bundle).as_posix() for p in tiny_bundle.rglob("*") if p.is_file()}
    assert files - set(manifest["artifacts"]) == {"manifest.json", "build_report.json"}
    assert verify_artifacts(tiny_bundle, manifest) == []
    assert {"vision.onnx", "vision.onnx.data", "preprocess.json", "tokenizer/tokenizer.json"} <= set(manifest["artifacts"])
    for key in ("schema_version", "toolchain", "recipe", "recipe_sha256", "components", "partitions", "profiles",
                "passes", "image_token_rules"):
        assert key in manifest


def test_a_failed_compile_leaves_nothing_and_keeps_an_old_bundle(tmp_path, monkeypatch):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {source: zoo, name: tiny-llava}\n")

    def explode(*a, **k):
        raise UserError("boom")

    monkeypatch.setattr("mmtrt.bundle.writer.write_manifest", explode)
    with pytest.raises(UserError):
        compile_recipe(recipe, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("old")
    with pytest.raises(UserError, match="--force"):
        compile_recipe(recipe, tmp_path / "out")
    with pytest.raises(UserError):
        compile_recipe(recipe, tmp_path / "out", force=True)
    assert (tmp_path / "out" / "keep").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "r.yaml"]


def test_edited_artifact_is_reported(tiny_bundle, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_bundle, copy)
    (copy / "preprocess.json").write_text("{}")
    assert verify_artifacts(copy, read_manifest(copy)) == ["preprocess.json"]
