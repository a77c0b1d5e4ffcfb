"""docs/RECIPES.md is generated from the schema; it must match what the code accepts."""

from conftest import ROOT
from mmtrt.recipe_docs import render


def test_recipe_reference_is_current():
    assert (ROOT / "docs" / "RECIPES.md").read_text() == render(), "run: python -m mmtrt.recipe_docs > docs/RECIPES.md"
