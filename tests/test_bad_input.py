"""Bad input of every class the README lists gets one line naming the problem and exit code 2, and nothing is
lost or half-written: broken checkpoints, bundles, indexes, inputs files, images, arguments, recipes."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import hostile
from builders import random_image
from mmtrt.cli import main
from mmtrt.errors import UserError
from mmtrt.eval.suites import run_suite
from mmtrt.runtime import load


def one_line_error(capsys, argv, *words):
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


@pytest.fixture
def checkpoint(siglip_checkpoint, tmp_path):
    folder = shutil.copytree(siglip_checkpoint, tmp_path / "ckpt")
    (tmp_path / "r.yaml").write_text("model: {source: hf, path: ckpt}\n")
    return folder


@pytest.fixture
def bundle(tiny_bundle, tmp_path):
    return shutil.copytree(tiny_bundle, tmp_path / "copy.bundle")


@pytest.fixture
def image(tmp_path, rng):
    path = tmp_path / "img.png"
    random_image(rng, 40, 48).save(path)
    return path


def test_truncated_safetensors(checkpoint, capsys):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    one_line_error(capsys, ["compile", checkpoint.parent / "r.yaml", "-o", checkpoint.parent / "out"],
                   "could not load the weights", "save_pretrained")
    assert not (checkpoint.parent / "out").exists()


@pytest.mark.parametrize("text, words", [("{not json", ["config.json", "Expecting"]),
                                         ("[1, 2]", ["config.json", "not a JSON object"]),
                                         (None, ["hidden_size", "expected int"])])
def test_broken_config_json(checkpoint, capsys, text, words):
    config = checkpoint / "config.json"
    if text is None:
        data = json.loads(config.read_text())
        data["text_config"]["hidden_size"] = "big"
        text = json.dumps(data)
    config.write_text(text)
    one_line_error(capsys, ["compile", checkpoint.parent / "r.yaml", "--plan"], *words)


def test_deleted_external_data(bundle, image, capsys):
    (bundle / "llm.onnx.data").unlink()
    one_line_error(capsys, ["run", bundle, "--image", image, "--prompt", "hi"], "llm.onnx.data missing")


@pytest.mark.parametrize("name, text, words", [
    ("manifest.json", "{broken", ["manifest.json", "restore the bundle"]),
    ("manifest.json", "[]", ["manifest.json", "JSON object"]),
    ("engines/index.json", "{broken", ["engines/index.json", "build-engines"]),
    ("engines/index.json", "[1]", ["engines/index.json", "build-engines"]),
])
def test_bundle_json_that_is_not_json(bundle, image, capsys, name, text, words):
    path = bundle / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    for argv in (["run", bundle, "--image", image, "--prompt", "hi"], ["compare", bundle, bundle]):
        one_line_error(capsys, argv, *words)


def test_build_report_that_is_not_json(bundle, capsys):
    (bundle / "build_report.json").write_text("{")
    one_line_error(capsys, ["inspect", bundle], "build_report.json")


def test_a_closed_pipe_is_not_an_error(tiny_bundle):
    """The JSON (over 100 kB) outgrows the pipe's buffer, so the writer meets the closed pipe."""
    proc = subprocess.run(f"{sys.executable} -m mmtrt.cli inspect {tiny_bundle} --json | head -c 1", shell=True,
                          capture_output=True, text=True)
    assert proc.stdout == "{" and proc.stderr == "", proc.stderr


def test_manifest_without_the_sections_the_runtime_reads(bundle, image, capsys):
    manifest = json.loads((bundle / "manifest.json").read_text())
    del manifest["dims"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    one_line_error(capsys, ["run", bundle, "--image", image, "--prompt", "hi"], "dims")


@pytest.mark.parametrize("cut", [1, 3])
def test_a_chat_template_that_does_not_parse(bundle, image, capsys, cut):
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["model"]["chat_template"] = manifest["model"]["chat_template"][:-cut]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    one_line_error(capsys, ["run", bundle, "--image", image, "--prompt", "hi"], "chat template", "recompile")


@pytest.mark.parametrize("limit", ["0", "-1", "two"])
def test_eval_limit_must_be_positive(tiny_bundle, capsys, limit):
    with pytest.raises(SystemExit) as exc:
        main(["eval", str(tiny_bundle), "--suite", "digits", "--limit", limit])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--limit" in err, err


def test_eval_limit_from_python_is_checked_too(tiny_bundle):
    with pytest.raises(UserError, match="limit 0"):
        run_suite(load(tiny_bundle), "digits", 0)


@pytest.mark.parametrize("flag", ["--json-out", "--save-inputs"])
def test_compare_output_into_a_missing_folder_fails_before_comparing(tiny_bundle, tmp_path, capsys, monkeypatch, flag):
    def never(*a, **k):
        raise AssertionError("the comparison ran before the output path was checked")

    monkeypatch.setattr("mmtrt.compare.report.compare", never)
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(tiny_bundle), str(tiny_bundle), flag, str(tmp_path / "missing" / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and "folder does not exist" in err, err


def saved_inputs(tiny_bundle, tmp_path, capsys):
    path = tmp_path / "inputs.npz"
    assert main(["compare", str(tiny_bundle), str(tiny_bundle), "--save-inputs", str(path)]) == 0
    capsys.readouterr()
    return dict(np.load(path))


@pytest.mark.parametrize("change, words", [
    (lambda d: {k: v for k, v in d.items() if not k.startswith("llm/")}, ["no inputs for llm"]),
    (lambda d: {k: v for k, v in d.items() if k != "llm/0/position_ids"}, ["llm/0", "position_ids"]),
    (lambda d: {**d, "embed/0/input_ids": d["embed/0/input_ids"].astype(np.float32)}, ["embed/0/input_ids", "int64"]),
    (lambda d: {**d, "vision/0/pixel_values": d["vision/0/pixel_values"][:, :, :7]}, ["vision", "pixel_values"]),
])
def test_inputs_that_do_not_fit_the_bundle(tiny_bundle, tmp_path, capsys, change, words):
    data = change(saved_inputs(tiny_bundle, tmp_path, capsys))
    np.savez(tmp_path / "bad.npz", **data)
    one_line_error(capsys, ["compare", tiny_bundle, tiny_bundle, "--inputs", tmp_path / "bad.npz",
                            "--save-inputs", tmp_path / "again.npz"], *words)
    assert not (tmp_path / "again.npz").exists()


@pytest.mark.parametrize("content", [b"", b"not an npz at all", None])
def test_inputs_that_are_not_npz(tiny_bundle, tmp_path, capsys, content):
    path = tmp_path / "inputs.npz"
    if content is None:
        np.save(tmp_path / "array.npy", np.zeros(3))
        path = tmp_path / "array.npy"
    else:
        path.write_bytes(content)
    one_line_error(capsys, ["compare", tiny_bundle, tiny_bundle, "--inputs", path], "not an .npz")


def test_dump_ir_naming_a_file(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("keep me")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {source: zoo, name: tiny-llava}\n")
    one_line_error(capsys, ["compile", recipe, "-o", tmp_path / "out", "--dump-ir", tmp_path / "notes.txt"],
                   "--dump-ir", "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "keep me" and not (tmp_path / "out").exists()


def test_decompression_bomb_image(tiny_bundle, image, capsys, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 40x48 is over twice that: PIL raises, not warns
    one_line_error(capsys, ["run", tiny_bundle, "--image", image, "--prompt", "hi"], "decompression bomb")


@pytest.mark.parametrize("text, place", [
    ("model: {source: zoo, name: tiny-llava\npasses: []\n", "r.yaml:2:7:"),
    ("model:\n  source: zoo\n name: tiny-llava\n", "r.yaml:3:2:"),
    ("model: {source: zoo, name: tiny-llava}\n\tpasses: []\n", "r.yaml:2:1:"),
    ("model: *anchor\n", "r.yaml:1:8:"),
])
def test_yaml_errors_give_line_and_column(tmp_path, capsys, text, place):
    (tmp_path / "r.yaml").write_text(text)
    one_line_error(capsys, ["compile", tmp_path / "r.yaml", "--plan"], place, "not valid YAML")


def test_recipe_that_is_not_text(tmp_path, capsys):
    (tmp_path / "r.yaml").write_bytes(b"\xff\xfe\x00model")
    one_line_error(capsys, ["compile", tmp_path / "r.yaml", "--plan"], "not UTF-8")


@pytest.mark.parametrize("argv, words", [
    (["run", "B", "--image", "I", "--prompt", "p", "--max-new-tokens", "0"], ["--max-new-tokens"]),
    (["run", "B", "--image", "I", "--prompt", "p", "--threads", "-2"], ["--threads"]),
    (["compare", "B", "B", "--atol", "nan"], ["--atol"]),
    (["compare", "B", "B", "--rtol", "-1"], ["--rtol"]),
    (["compare", "B", "B", "--seed", "-5"], ["--seed"]),
    (["eval", "B", "--suite", "nope"], ["--suite"]),
    (["frobnicate"], ["frobnicate"]),
    ([], ["command"]),
])
def test_argument_errors_are_one_line(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_an_unwritable_home_adds_no_line(tiny_bundle, tmp_path, rng):
    """ONNX Runtime's telemetry warns where it cannot store its device id; the error stays one line."""
    import os

    image = tmp_path / "i.png"
    random_image(rng, 40, 40).save(image)
    (tmp_path / "home").write_text("a file, not a folder")
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "XDG_CACHE_HOME")}
    proc = subprocess.run([sys.executable, "-m", "mmtrt.cli", "run", str(tiny_bundle), "--image", str(image),
                           "--prompt", "hi", "--max-new-tokens", "99"], capture_output=True, text=True, timeout=120,
                          env={**env, "HOME": str(tmp_path / "home")})
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_a_folder_as_the_image(tiny_bundle, tmp_path, capsys):
    one_line_error(capsys, ["run", tiny_bundle, "--image", tmp_path, "--prompt", "hi"],
                   "is a folder, not an image file")


@pytest.mark.parametrize("kind", sorted(hostile.BAD_IMAGES))
def test_image_files_that_trip_the_decoders(tiny_bundle, tmp_path, rng, capsys, kind):
    path = tmp_path / "bad.png"
    path.write_bytes(hostile.BAD_IMAGES[kind](rng))
    one_line_error(capsys, ["run", tiny_bundle, "--image", path, "--prompt", "hi"], "cannot read image", str(path))


def test_a_manifest_whose_kv_cache_is_not_its_graphs(tiny_paged_bundle, tiny_bundle, tmp_path, image, capsys):
    """The paged bundle's manifest over the plain (hf) bundle's LLM graph, its hashes updated to match."""
    import hashlib

    copy = shutil.copytree(tiny_paged_bundle, tmp_path / "mixed.bundle")
    manifest = json.loads((copy / "manifest.json").read_text())
    for name in ("llm.onnx", "llm.onnx.data"):
        shutil.copyfile(tiny_bundle / name, copy / name)
        manifest["artifacts"][name] = hashlib.sha256((copy / name).read_bytes()).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    one_line_error(capsys, ["run", copy, "--image", image, "--prompt", "hi"], "model.kv_cache (paged)",
                   "seqlens_k" if "seqlens_k" in json.dumps(manifest["components"]["llm"]) else "block_table",
                   "does not match its graphs")
