"""The command line as a user meets it: commands that work, and bad input that fails with one line and exit 2."""

import json
import subprocess
import sys

import pytest
from PIL import Image

from builders import random_image
from mmtrt.bundle.manifest import read_manifest
from mmtrt.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "mmtrt.cli", *map(str, args)], capture_output=True, text=True)


def assert_one_line_error(proc, *words):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for w in words:
        assert w in lines[0]


def test_run_json_has_text_ids_and_timings(tiny_bundle, tmp_path, rng):
    image = tmp_path / "img.png"
    random_image(rng, 70, 90).save(image)
    proc = run_cli("run", tiny_bundle, "--image", image, "--prompt", "Hello?", "--max-new-tokens", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert 1 <= len(out["token_ids"]) <= 5 and isinstance(out["text"], str)
    assert set(out["timings"]) >= {"preprocess_ms", "vision_ms", "prefill_ms", "decode_ms_per_token"}


def test_unknown_recipe_key_names_key_place_and_allowed(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {source: zoo, name: tiny-llava}\nenvelope: {max_new_tokns: 3}\n")
    proc = run_cli("compile", recipe, "-o", tmp_path / "out")
    assert_one_line_error(proc, "max_new_tokns", "envelope", "max_new_tokens")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("recipe_text, words", [
    ("model: {source: hf, path: nowhere}\n", ["nowhere", "does not exist"]),
    ("model: {source: zoo, name: tiny-llava}\npasses:\n  - no_such_pass: {}\n", ["no_such_pass", "graph_cleanup"]),
    ("model: {source: zoo, name: tiny-llava}\npasses:\n  - graph_cleanup: {fold: true}\n", ["fold", "fold_constants"]),
    ("model: {source: zoo, name: tiny-llava}\npasses:\n  - dead_layer_elimination: {}\n  - dead_layer_elimination: {}\n",
     ["passes[1]", "vision.hidden_state_stack"]),
    ("model: {source: zoo, name: tiny-llava}\nenvelope: {max_new_tokens: 5000}\n", ["KV capacity", "max_new_tokens"]),
    ("model: {source: zoo, name: tiny-llava}\npartition: {vision: [tensorrt-llm]}\n", ["partition.vision", "onnxruntime"]),
])
def test_bad_recipes_fail_in_process_with_exit_2(tmp_path, capsys, recipe_text, words):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(recipe_text)
    assert main(["compile", str(recipe), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err
    assert not (tmp_path / "out").exists()


def test_missing_recipe_file(tmp_path):
    assert_one_line_error(run_cli("compile", tmp_path / "none.yaml"), "none.yaml", "does not exist")


@pytest.mark.parametrize("make_image, words", [
    (lambda p, rng: p.write_bytes(b"not an image"), ["cannot read image"]),
    (lambda p, rng: Image.new("RGB", (2_000_000, 1)).save(p, format="PNG"), ["2000000x1", "closer to square"]),
    (lambda p, rng: None, ["does not exist"]),
])
def test_bad_images(tiny_bundle, tmp_path, capsys, rng, make_image, words):
    image = tmp_path / "img.png"
    make_image(image, rng)
    assert main(["run", str(tiny_bundle), "--image", str(image), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and all(w in err for w in words), err


def test_prompt_too_long_and_too_many_tokens(tiny_bundle, tmp_path, capsys, rng):
    image = tmp_path / "img.png"
    random_image(rng, 40, 40).save(image)
    assert main(["run", str(tiny_bundle), "--image", str(image), "--prompt", "x" * 300]) == 2
    assert "envelope.prompt_tokens.max" in capsys.readouterr().err
    assert main(["run", str(tiny_bundle), "--image", str(image), "--prompt", "hi", "--max-new-tokens", "999"]) == 2
    assert "envelope.max_new_tokens" in capsys.readouterr().err
    assert main(["run", str(tiny_bundle), "--image", str(image), "--prompt", "no image", "--raw-prompt"]) == 2
    assert "<image>" in capsys.readouterr().err


def test_not_a_bundle(tmp_path):
    assert_one_line_error(run_cli("inspect", tmp_path), "not an mmtrt bundle")


def test_plan_resolves_without_building(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {source: zoo, name: tiny-llava}\npasses:\n  - dead_layer_elimination: {}\n")
    assert main(["compile", str(recipe), "--plan", "--json", "-o", str(tmp_path / "out")]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [p["pass"] for p in plan["passes"]] == ["dead_layer_elimination"]
    assert plan["partitions"]["vision"]["planned"] == "tensorrt"
    assert plan["dims_before_passes"]["seq"]["max"] == 256 + 64
    assert not (tmp_path / "out").exists()


def test_inspect_shows_partitions_reasons_passes_and_hashes(tiny_bundle, capsys):
    assert main(["inspect", str(tiny_bundle)]) == 0
    text = capsys.readouterr().out
    manifest = read_manifest(tiny_bundle)
    assert manifest["partitions"]["vision"]["reason"] in text
    assert "dead_layer_elimination" in text and "layers_removed=1" in text
    assert all(digest[:16] in text for digest in manifest["artifacts"].values())
    assert main(["inspect", str(tiny_bundle), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["manifest"] == manifest
