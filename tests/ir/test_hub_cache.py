"""`model.path` may be a Hugging Face Hub id, found in the local Hugging Face cache and never downloaded."""

import shutil
import socket

import huggingface_hub.constants
import pytest

from mmtrt.compiler import make_plan
from mmtrt.errors import UserError
from mmtrt.ir.hub_cache import checkpoint_folder

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, siglip_checkpoint):
    """A Hugging Face cache holding the SigLIP test checkpoint as `acme/tiny-llava`, laid out as the hub's client
    writes it: refs/main names the snapshot folder."""
    repo = tmp_path / "hub" / "models--acme--tiny-llava"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    shutil.copytree(siglip_checkpoint, repo / "snapshots" / COMMIT)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return repo / "snapshots" / COMMIT


def test_a_hub_id_is_read_from_the_local_cache(tmp_path, hub_cache):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: {source: hf, path: acme/tiny-llava}\n")
    plan = make_plan(recipe)
    assert plan.facts["vision"]["model_type"] == "siglip_vision_model"
    assert checkpoint_folder("acme/tiny-llava", tmp_path) == hub_cache


def test_a_folder_of_that_name_wins_over_the_cache(tmp_path, hub_cache):
    (tmp_path / "acme" / "tiny-llava").mkdir(parents=True)
    assert checkpoint_folder("acme/tiny-llava", tmp_path) == tmp_path / "acme" / "tiny-llava"


def test_a_hub_id_not_in_the_cache_is_one_line_and_no_download(tmp_path, hub_cache, monkeypatch):
    connections = []
    monkeypatch.setattr(socket.socket, "connect", lambda sock, address: connections.append(address))
    with pytest.raises(UserError) as err:
        checkpoint_folder("llava-hf/llava-1.5-7b-hf", tmp_path)
    assert connections == []
    message = str(err.value)
    for words in ("llava-hf/llava-1.5-7b-hf", "never downloads", "hf download llava-hf/llava-1.5-7b-hf",
                  str(tmp_path / "hub")):
        assert words in message, message
