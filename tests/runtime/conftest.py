"""The tiny zoo model and the saved SigLIP checkpoint compiled again with the static and paged KV layouts."""

import pytest

from conftest import ROOT, compile_to

STATIC = "  - kv_layout: {layout: static}\n"
PAGED = "  - kv_layout: {layout: paged, block_tokens: 16}\n"


@pytest.fixture(scope="session")
def tiny_static_bundle(tmp_path_factory):
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace("envelope:", STATIC + "envelope:")
    return compile_to(tmp_path_factory.mktemp("tiny-static"), recipe, "static.bundle")


@pytest.fixture(scope="session")
def tiny_paged_bundle(tmp_path_factory):
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace("envelope:", PAGED + "envelope:")
    return compile_to(tmp_path_factory.mktemp("tiny-paged"), recipe, "paged.bundle")


@pytest.fixture(scope="session")
def siglip_static_bundle(siglip_checkpoint):
    recipe = "model: {source: hf, path: checkpoint}\npasses:\n  - dead_layer_elimination: {}\n" + STATIC
    return compile_to(siglip_checkpoint.parent, recipe, "static.bundle")
