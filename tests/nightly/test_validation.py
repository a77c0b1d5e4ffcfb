"""The nightly refuses bad input before any work: exit code 2, one line, nothing built, no night recorded."""

import pytest

from conftest import ROOT
from mmtrt.cli import main

GOOD = f"{{name: base, recipe: {ROOT}/recipes/tiny-llava.yaml}}"

def nightly(tmp_path, capsys, recipes, *extra, out=None):
    (tmp_path / "n.yaml").write_text(f"reference: base\nhistory: history.sqlite\ncache: cache\nrecipes:\n"
                                     + "".join(f"  - {r}\n" for r in recipes)
                                     + f"benchmark: {{image: {ROOT}/examples/sample.png}}\n")
    out = out or tmp_path / "report"
    code = main(["nightly", str(tmp_path / "n.yaml"), "-o", str(out), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert not (tmp_path / "history.sqlite").exists() and not (tmp_path / "cache").exists()
    return err

def test_a_missing_recipe_file(tmp_path, capsys):
    err = nightly(tmp_path, capsys, [GOOD, "{name: gone, recipe: gone.yaml}"])
    assert "gone.yaml does not exist" in err and not (tmp_path / "report").exists()

def test_a_negative_eval_limit(tmp_path, capsys):
    assert "eval limits are counts of at least 1" in nightly(tmp_path, capsys, [GOOD.replace("}", ", eval: {perplexity: -1}}")])

def test_an_output_that_is_a_file(tmp_path, capsys):
    (tmp_path / "out.txt").write_text("mine")
    assert "is a file" in nightly(tmp_path, capsys, [GOOD], out=tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_text() == "mine"

@pytest.mark.parametrize("content, words", [("{", "is not JSON"), ('{"night": {}}', "lacks a shard's"),
                                             ('[1, 2]', "lacks a shard's")])
def test_a_shard_that_is_not_a_shard_report(tmp_path, capsys, content, words):
    shard = tmp_path / "shard"
    shard.mkdir()
    (shard / "nightly.json").write_text(content)
    assert words in nightly(tmp_path, capsys, [GOOD], "--merge", str(shard))
