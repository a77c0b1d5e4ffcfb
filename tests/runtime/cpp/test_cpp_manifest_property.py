"""Property: any one field of a real bundle's manifest mutated, by type or by value, gives in both runtimes either
exit 2 with one line, or exactly the unmutated answer; never a traceback, a crash or another answer.

Values are drawn from what no valid manifest holds (another type, null, zero, negatives, sizes past any machine,
empty or control-character text) and from the edits the consistency checks cover (the vision's tokens, the cache
layout and block size). An edit that keeps every field valid and consistent (another end-of-sequence id) is what
a pinned digest or a signature refuses (tests/runtime/cpp/test_cpp_integrity.py); there the two runtimes must give
one answer."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import random_image
from cpp_harness import PROGRAM, needs_build
from mmtrt.errors import UserError
from mmtrt.runtime import load

pytestmark = needs_build
SKIP = ("placement", "polygraphy", "passes", "profiles", "image_token_rules", "properties", "toolchain")


def leaf_paths(node, path=()):
    """Every key and item of the manifest (big report sections only down to their first level)."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in items:
        out.append((*path, key))
        if not (path and path[0] in SKIP):
            out += leaf_paths(child, (*path, key))
    return out


def mutations(value):
    by_type = [None, True, "x", 1.5, [], {}, "a\u0000b"]
    if isinstance(value, bool):
        by_value = [not value]
    elif isinstance(value, int):
        by_value = [0, -1, 2**40, 10**30, value + 1]
    elif isinstance(value, str):
        by_value = ["", value + "\u0001", value[:-1]]
    elif isinstance(value, list):
        by_value = [value[:-1], value + value[-1:]] if value else [[0]]
    else:
        by_value = []
    return [v for v in by_type + by_value if not (type(v) is type(value) and v == value)] + ["<delete>"]


@pytest.fixture(scope="module")
def case(tiny_paged_bundle, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("property")
    image = tmp / "image.png"
    random_image(np.random.default_rng(11), 44, 50).save(image)
    manifest = json.loads((tiny_paged_bundle / "manifest.json").read_text())
    answer = load(tiny_paged_bundle, threads=1).generate(image, "hi", 3).token_ids
    return tiny_paged_bundle, tmp, image, manifest, answer


def mutated_copy(bundle, tmp, manifest, path, value):
    copy = tmp / "m.bundle"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(bundle, copy, copy_function=os.link)  # the artifacts shared, read only
    (copy / "manifest.json").unlink()
    edited = json.loads(json.dumps(manifest))
    node = edited
    for key in path[:-1]:
        node = node[key]
    if value == "<delete>":
        del node[path[-1]]
    else:
        node[path[-1]] = value
    (copy / "manifest.json").write_text(json.dumps(edited))
    return copy


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_mutated_field_is_refused_in_one_line_or_changes_nothing(case, data):
    bundle, tmp, image, manifest, answer = case
    path = data.draw(st.sampled_from(leaf_paths(manifest)), label="path")
    node = manifest
    for key in path:
        node = node[key]
    value = data.draw(st.sampled_from(mutations(node)), label="value")
    copy = mutated_copy(bundle, tmp, manifest, path, value)
    try:
        ours = load(copy, threads=1).generate(image, "hi", 3).token_ids
        if path[:2] in (("model", "eos_token_ids"), ("model", "chat_template")):  # valid and consistent: another
            answer = ours  # special token ending the answer, or another template that renders
        assert ours == answer, f"python: {path} = {value!r} changed the answer"
    except UserError as exc:
        assert "\n" not in str(exc)
    proc = subprocess.run([str(PROGRAM), str(copy), "--image", str(image), "--prompt", "hi", "--max-new-tokens",
                           "3", "--threads", "1", "--json"], capture_output=True, text=True, timeout=120)
    if proc.returncode == 0:
        assert json.loads(proc.stdout)["token_ids"] == answer, f"c++: {path} = {value!r} changed the answer"
    else:
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, (path, value, proc.returncode,
                                                                              proc.stderr[-500:])
