"""The recipe schema is strict and its errors say what to fix."""

import pytest

from mmtrt.errors import UserError
from mmtrt.recipe import load_recipe


def write(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text", ["model: {source: hf, path: /x}\n", "model: {source: zoo, name: tiny-llava}\n"])
def test_minimal_recipes_take_defaults(tmp_path, text):
    recipe, folder = load_recipe(write(tmp_path, text))
    assert recipe.passes == [] and recipe.envelope.max_new_tokens == 64 and folder == tmp_path


@pytest.mark.parametrize("text, words", [
    ("modle: {source: zoo, name: tiny-llava}\n", ["unknown key 'modle'", "the top level", "model, passes"]),
    ("model: {source: zoo, name: tiny-llava, revision: 2}\n", ["'revision'", "in model", "source, path, name"]),
    ("model: {source: zoo, name: tiny-llava}\nenvelope: {batch: {min: 1, opt: 1, maxx: 2}}\n", ["'maxx'", "envelope.batch", "min, opt, max"]),
    ("model: {source: zoo, name: tiny-llava}\nenvelope: {batch: {min: 3, opt: 1, max: 2}}\n", ["min <= opt <= max"]),
    ("model: {source: hf}\n", ["needs model.path"]),
    ("model: {source: zoo, name: huge-llava}\n", ["tiny-llava"]),
    ("model: {source: zoo, name: tiny-llava}\npasses:\n  - {a: {}, b: {}}\n", ["one-key mapping"]),
    ("model: [oops\n", ["not valid YAML"]),
    ("- 1\n", ["a recipe is a mapping"]),
])
def test_errors_name_the_problem(tmp_path, text, words):
    with pytest.raises(UserError) as err:
        load_recipe(write(tmp_path, text))
    assert all(w in str(err.value) for w in words), str(err.value)
    assert "\n" not in str(err.value)
