"""The tiny zoo model and the saved SigLIP checkpoint compiled again with the static KV layout (the paged one is in
the root conftest: the serving tests use it too)."""

import pytest

from conftest import ROOT, compile_to

STATIC = "  - kv_layout: {layout: static}\n"


@pytest.fixture(scope="session")
def tiny_static_bundle(tmp_path_factory):
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace("envelope:", STATIC + "envelope:")
    return compile_to(tmp_path_factory.mktemp("tiny-static"), recipe, "static.bundle")


@pytest.fixture(scope="session")
def siglip_static_bundle(siglip_checkpoint):
    recipe = "model: {source: hf, path: checkpoint}\npasses:\n  - dead_layer_elimination: {}\n" + STATIC
    return compile_to(siglip_checkpoint.parent, recipe, "static.bundle")
