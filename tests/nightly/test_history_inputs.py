"""The history writes a night whole or not at all; the cache key follows content, not paths, and names the input
that changed."""

import importlib.util
import shutil
import sqlite3
import sys

import pytest
from sqlalchemy.exc import IntegrityError

from mmtrt.nightly import inputs as inputs_module
from mmtrt.nightly.config import RecipeEntry
from mmtrt.nightly.history import History, history_url
from mmtrt.nightly.inputs import build_inputs, cache_key, changed_inputs
from mmtrt.nightly.night import _determinism
from mmtrt.recipe import Recipe

NIGHT = dict(label="n", started_at="t0", finished_at="t1", host="h", mmtrt_version="0", config_sha256="c",
             shards=1, regressions=0)


def row(recipe, metrics, fired=(), key="k", digest="d"):
    return dict(recipe=recipe, status="ok", cache="miss", cache_key=key, bundle_sha256=digest, metrics=metrics,
                fired=list(fired), inputs={"recipe": key}, changed=[])


def test_a_night_is_one_transaction(tmp_path):
    history = History(history_url("h.sqlite", tmp_path))
    history.record(NIGHT, [row("a", {"m": 1.0})])
    with pytest.raises(IntegrityError):  # the second result is invalid: the first must not stay either
        history.record(NIGHT, [row("a", {"m": 2.0}), {**row("b", {}), "status": None}])
    with sqlite3.connect(tmp_path / "h.sqlite") as db:
        assert db.execute("select count(*) from nights").fetchone()[0] == 1
        assert db.execute("select count(*) from results").fetchone()[0] == 1


def test_baseline_is_the_last_good_night(tmp_path):
    history = History(history_url("h.sqlite", tmp_path))
    first = history.record(NIGHT, [row("a", {"m": 1.0})])
    history.record(NIGHT, [row("a", {"m": 9.0}, fired=[{"rule": "x"}])])
    assert history.baseline("a")["night_id"] == first and history.baseline("b") is None
    assert history.hash_for_key("a", "k") == "d" and history.hash_for_key("a", "other") is None


def test_same_inputs_another_bundle_is_nondeterminism(tmp_path):
    history = History(history_url("h.sqlite", tmp_path))
    history.record(NIGHT, [row("a", {}, key="k1", digest="aaaa")])
    entry = RecipeEntry(name="a", recipe="x.yaml")
    same = {"cache_key": "k1", "bundle_sha256": "aaaa", "cache": "miss"}
    assert _determinism(entry, same, "", None, history) is None
    other = {**same, "bundle_sha256": "bbbb"}
    assert "gave bundle aaaa before and bbbb now" in _determinism(entry, other, "", None, history)


def test_key_follows_checkpoint_content_not_its_folder(tmp_path, siglip_checkpoint):
    folder = tmp_path / "ck"
    shutil.copytree(siglip_checkpoint, folder)
    recipe = Recipe.model_validate({"model": {"source": "hf", "path": "ck"}})
    before = build_inputs(recipe, tmp_path)
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.copytree(folder, moved / "ck")
    assert cache_key(build_inputs(recipe, moved)) == cache_key(before)
    weights = next(folder.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    after = build_inputs(recipe, tmp_path)
    assert changed_inputs(before, after) == ["model"] and cache_key(after) != cache_key(before)


def test_pass_code_change_names_the_pass(tmp_path, monkeypatch):
    (tmp_path / "my_pass.py").write_text("class MyPass:\n    name = 'my_pass'\n")
    spec = importlib.util.spec_from_file_location("my_pass", tmp_path / "my_pass.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "my_pass", module)
    monkeypatch.setattr(inputs_module, "get_pass", lambda name: module.MyPass)
    recipe = Recipe.model_validate({"model": {"source": "zoo", "name": "tiny-llava"},
                                    "passes": [{"my_pass": {}}]})
    before = build_inputs(recipe, tmp_path)
    (tmp_path / "my_pass.py").write_text("class MyPass:\n    name = 'my_pass'  # changed\n")
    assert changed_inputs(before, build_inputs(recipe, tmp_path)) == ["pass:my_pass"]


def test_changed_inputs_in_words():
    before = {"recipe": "r", "toolchain": {"torch": "2.14.1", "onnx": "1.23.2"}, "pass:a": "x"}
    now = {"recipe": "r", "toolchain": {"torch": "2.15.0", "onnx": "1.23.2"}, "pass:b": "y"}
    assert changed_inputs(before, now) == ["pass:a removed", "pass:b added", "toolchain: torch 2.14.1 -> 2.15.0"]
    assert changed_inputs(None, now) == ["first build"]
