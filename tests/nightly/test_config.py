"""NIGHTLY.yaml is strict: a wrong key is one line naming it and exit code 2, before any work."""

import pytest

from conftest import ROOT
from mmtrt.cli import main
from mmtrt.errors import UserError
from mmtrt.nightly.config import load_config, parse_shard, shard_entries
from mmtrt.nightly.inputs import effective_recipe

GOOD = f"""reference: a
recipes:
  - {{name: a, recipe: {ROOT}/recipes/tiny-llava.yaml}}
  - {{name: b, recipe: {ROOT}/recipes/tiny-llava-fp16.yaml, rules: {{perplexity_increase_pct: 9}}}}
  - {{name: c, recipe: {ROOT}/recipes/tiny-llava.yaml, override: {{passes: [{{graph_cleanup: {{}}}}]}}}}
"""


def write(tmp_path, text):
    path = tmp_path / "nightly.yaml"
    path.write_text(text)
    return path


def test_unknown_key_is_one_line_and_exit_2(tmp_path, capsys):
    path = write(tmp_path, GOOD + "benchmark: {round: 3}\n")
    assert main(["nightly", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "benchmark.round: unknown key 'round' (did you mean 'rounds'?)" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "nightly").exists()


@pytest.mark.parametrize("text, message", [
    (GOOD.replace("reference: a", "reference: z"), "reference 'z' is not one of the recipes"),
    (GOOD.replace("name: b", "name: a"), "recipe names must be unique, repeated: a"),
    (GOOD.replace("eval", "eval") + "  - {name: d, recipe: x.yaml, eval: {bleu: 3}}\n",
     "recipes[3].eval.bleu: Input should be 'digits', 'perplexity' or 'parity', got 'bleu'"),
    ("recipes: []\nreference: a\n", "recipes: List should have at least 1 item"),
])
def test_bad_configs_name_the_problem(tmp_path, text, message):
    with pytest.raises(UserError, match=message.replace(".", r"\.").replace("[", r"\[")):
        load_config(write(tmp_path, text))


def test_per_recipe_rules_replace_only_the_keys_given(tmp_path):
    config, _, _ = load_config(write(tmp_path, GOOD))
    a, b, _ = config.recipes
    assert config.rules_for(a) == config.rules
    assert config.rules_for(b).perplexity_increase_pct == 9
    assert config.rules_for(b).accuracy_drop_points == config.rules.accuracy_drop_points


def test_override_is_validated_as_a_recipe(tmp_path):
    config, base, _ = load_config(write(tmp_path, GOOD))
    recipe, _ = effective_recipe(config.recipes[2], base)
    assert recipe.pass_list() == [("graph_cleanup", {})]
    bad = GOOD.replace("override: {passes:", "override: {pases:")
    config, base, _ = load_config(write(tmp_path, bad))
    with pytest.raises(UserError, match=r"override of c: pases: unknown key 'pases' \(did you mean 'passes'\?\)"):
        effective_recipe(config.recipes[2], base)


def test_shards_cover_every_recipe_once_and_each_has_the_reference(tmp_path):
    config, _, _ = load_config(write(tmp_path, GOOD))
    shards = [[e.name for e in shard_entries(config, (i, 2))] for i in (1, 2)]
    assert shards == [["a", "c"], ["a", "b"]]
    assert sorted(set(shards[0]) | set(shards[1])) == ["a", "b", "c"]
    for bad in ("0/2", "3/2", "1-2", "x"):
        with pytest.raises(UserError, match="must be I/N"):
            parse_shard(bad)
