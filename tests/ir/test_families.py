"""The frontend hands a checkpoint to its family by model_type, and refuses an unknown one in one line."""

import json

import pytest

from mmtrt.errors import UserError
from mmtrt.ir.families import FAMILIES, family
from mmtrt.ir.frontend import describe_source
from mmtrt.recipe import ModelSource


def test_every_family_module_provides_the_contract():
    for model_type in FAMILIES:
        module = family(model_type)
        assert isinstance(module.MODEL_CLASS, str) and callable(module.model_facts) and callable(module.lower)


def test_an_unknown_model_type_is_refused_in_one_line_listing_the_supported(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "blip-2"}))
    with pytest.raises(UserError) as info:
        describe_source(ModelSource(source="hf", path="checkpoint"), tmp_path)
    message = str(info.value)
    assert "\n" not in message and "'blip-2'" in message and str(folder) in message
    assert all(model_type in message for model_type in FAMILIES)
