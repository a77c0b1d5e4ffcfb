"""Slow (set MMTRT_SLOW=1): on zoo:dino-smollm the C++ runtime answers the 20 first held-out digits with the
Python runtime's greedy tokens. The bundle is MMTRT_DINO_BUNDLE, default /work/bundles/dino-smollm.bundle."""

import os
from pathlib import Path

import pytest

from cpp_harness import CApi, needs_library
from mmtrt.eval import digits
from mmtrt.runtime import load

BUNDLE = Path(os.environ.get("MMTRT_DINO_BUNDLE", "/work/bundles/dino-smollm.bundle"))
IMAGES = 20

pytestmark = [needs_library,
              pytest.mark.skipif(os.environ.get("MMTRT_SLOW") != "1", reason="slow: set MMTRT_SLOW=1"),
              pytest.mark.skipif(not BUNDLE.is_dir(), reason=f"{BUNDLE} is not there; compile zoo:dino-smollm")]


def test_digits_answers_equal_the_python_runtime(tmp_path):
    pipe = load(BUNDLE, threads=1)
    api = CApi()
    status, handle = api.load(BUNDLE)
    assert status == 0, api.error()
    try:
        same = 0
        for i, (image, label) in enumerate(digits.samples("heldout", IMAGES, page=pipe.image_side)):
            path = tmp_path / f"{i}.png"
            image.save(path)
            theirs = pipe.generate(path, digits.PROMPT, max_new_tokens=4)
            status, ours = api.generate(handle, path, digits.PROMPT, 4)
            assert status == 0, api.error()
            assert ours["token_ids"] == theirs.token_ids and ours["text"] == theirs.text, (i, label)
            same += 1
        assert same == IMAGES
    finally:
        api.free(handle)
