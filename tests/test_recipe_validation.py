"""A recipe is checked whole before anything heavy loads: every problem in one run, each named by its path, with
strict types (YAML's `true` is not 1, a quoted "16" is not a number) and options that do not apply refused."""

import subprocess
import sys
import time

import pytest

from mmtrt.errors import UserError
from mmtrt.recipe import load_recipe

ZOO = "model: {source: zoo, name: tiny-llava}\n"


def problems_of(tmp_path, text) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_recipe(path)
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("passes, words", [
    ("- kv_layout: {layout: paged, block_tokens: true}", ["passes[0].kv_layout.block_tokens", "an integer", "true"]),
    ("- kv_layout: {layout: paged, block_tokens: '16'}", ["passes[0].kv_layout.block_tokens", "'16'", "without quotes"]),
    ("- token_prune: {keep: true}", ["passes[0].token_prune.keep", "true"]),
    ("- awq_int4: {accuracy_level: true}", ["passes[0].awq_int4.accuracy_level", "True"]),
    ("- awq_int4: {accuracy_level: 1.0}", ["passes[0].awq_int4.accuracy_level", "1.0"]),
    ("- recover: {lr: 1e-4}", ["passes[0].recover.lr", "a number", "write 1.0e-4"]),
    ("- graph_cleanup: {fold_constants: 1}", ["passes[0].graph_cleanup.fold_constants", "true or false", "got 1"]),
    ("- channel_prune: {vision: {mlp: '0.3'}}", ["passes[0].channel_prune.vision.mlp", "'0.3'"]),
    ("- int8_prefill: {smoothing: 1.5}", ["passes[0].int8_prefill.smoothing", "0 to 1", "`search`", "1.5"]),
    ("- int8_prefill: {smoothing: searched}", ["passes[0].int8_prefill.smoothing", "`search`", "'searched'"]),
    ("- int8_prefill: {float_channels: {'*down_proj': -4}}", ["passes[0].int8_prefill.float_channels", "0 or more",
                                                                "-4"]),
    ("- int8_prefill: {float_channels: {'*down_proj': 0.5}}", ["passes[0].int8_prefill.float_channels", "0.5"]),
])
def test_pass_options_have_strict_types(tmp_path, passes, words):
    message = problems_of(tmp_path, ZOO + f"passes:\n  {passes}\n")
    assert all(w in message for w in words), message


@pytest.mark.parametrize("text, words", [
    ("envelope: {max_new_tokens: true}\n", ["envelope.max_new_tokens", "an integer", "true"]),
    ("envelope: {batch: {min: 1, opt: 1, max: '4'}}\n", ["envelope.batch.max", "'4'"]),
    ("budgets: {digits_accuracy_drop: yes}\n", ["budgets.digits_accuracy_drop", "true"]),
])
def test_recipe_keys_have_strict_types(tmp_path, text, words):
    message = problems_of(tmp_path, ZOO + text)
    assert all(w in message for w in words), message


@pytest.mark.parametrize("options, words", [
    ("{layout: static, block_tokens: 32}", ["block_tokens", "layout: paged"]),
    ("{block_tokens: 64}", ["block_tokens", "layout: paged"]),
    ("{layout: static, pool_blocks: 8}", ["pool_blocks", "layout: paged"]),
])
def test_paged_options_on_a_static_layout_are_refused(tmp_path, options, words):
    message = problems_of(tmp_path, ZOO + f"passes:\n  - kv_layout: {options}\n")
    assert all(w in message for w in words) and "passes[0].kv_layout" in message, message


def test_paged_options_on_a_paged_layout_are_taken(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(ZOO + "passes:\n  - kv_layout: {layout: paged, block_tokens: 32, pool_blocks: 8}\n")
    recipe, _ = load_recipe(path)
    assert recipe.pass_list() == [("kv_layout", {"layout": "paged", "block_tokens": 32, "pool_blocks": 8})]


def test_a_pass_key_is_named_by_its_path_with_the_closest_key(tmp_path):
    message = problems_of(tmp_path, ZOO + "passes:\n  - graph_cleanup: {}\n  - token_prune: {keep: 0.5, methd: norm}\n")
    assert "passes[1].token_prune.methd: unknown key 'methd' (did you mean 'method'?)" in message, message
    assert "in passes[1].token_prune:" in message and "the top level" not in message, message


THREE_TYPOS = ZOO + """envelope: {max_new_tokns: 8}
passes:
  - token_prune: {keep: 0.5, methd: norm}
  - graph_claenup: {}
"""

NO_TORCH = """
import sys, time
from mmtrt.cli import main
start = time.perf_counter()
code = main(["compile", sys.argv[1], "--plan"])
print(code, round(time.perf_counter() - start, 2), sorted(m for m in ("torch", "onnx", "numpy", "transformers")
                                                           if m in sys.modules))
"""


def test_three_typos_are_reported_in_one_run_without_importing_torch(tmp_path):
    recipe = tmp_path / "typos.yaml"
    recipe.write_text(THREE_TYPOS)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, str(recipe)], capture_output=True, text=True)
    wall = time.perf_counter() - start
    code, seconds, heavy = proc.stdout.split(" ", 2)
    assert code == "2" and heavy.strip() == "[]", proc.stdout + proc.stderr
    error = proc.stderr.strip()
    assert len(error.splitlines()) == 1 and "3 problems" in error, error
    for path in ("envelope.max_new_tokns", "passes[0].token_prune.methd", "passes[1]: unknown pass 'graph_claenup'"):
        assert path in error, error
    assert "did you mean 'graph_cleanup'?" in error
    print(f"validation {seconds} s in the command, {wall:.2f} s with the interpreter's start")
