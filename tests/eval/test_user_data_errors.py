"""Malformed user data is one line naming the file and the line, exit code 2, and nothing written."""

import json

import numpy as np
import pytest
from PIL import Image

from mmtrt.cli import main

PASS = "  - awq_int4: {method: rtn, group_size: 16, calibration: {images: recipe, samples: 2, text_windows: 0}}\n"


def write_images(folder, count=2):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def compile_fails(tmp_path, capsys, recipe_text):
    (tmp_path / "r.yaml").write_text("model: {source: zoo, name: tiny-llava}\n" + recipe_text)
    out = tmp_path / "out.bundle"
    assert main(["compile", str(tmp_path / "r.yaml"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert not out.exists() and not list(tmp_path.glob("out.bundle*")), "a failed compile left files behind"
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_a_missing_image_in_the_calibration_jsonl_names_file_and_line(tmp_path, capsys):
    write_images(tmp_path / "imgs")
    lines = [{"image": "imgs/0.png", "prompt": "What is it?"}, {"image": "imgs/nope.png", "prompt": "And this?"}]
    (tmp_path / "cal.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    err = compile_fails(tmp_path, capsys, f"calibration: {{jsonl: cal.jsonl}}\npasses:\n{PASS}")
    assert f"{tmp_path / 'cal.jsonl'}:2:" in err and "nope.png does not exist" in err


def test_a_line_that_is_not_json_names_file_and_line(tmp_path, capsys):
    write_images(tmp_path / "imgs")
    good = json.dumps({"image": "imgs/0.png", "prompt": "How many?", "answer": 3})
    (tmp_path / "qa.jsonl").write_text(f"{good}\n\n{good}\n{{image: imgs/1.png}}\n")
    err = compile_fails(tmp_path, capsys, "evaluate: {suites: [qa], qa: {data: qa.jsonl}}\n")
    assert f"{tmp_path / 'qa.jsonl'}:4: not JSON" in err


def test_an_empty_folder_names_the_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.txt").write_text("no images here")
    err = compile_fails(tmp_path, capsys, f"calibration: {{images: empty}}\npasses:\n{PASS}")
    assert f"image folder {tmp_path / 'empty'} holds no images" in err


@pytest.mark.parametrize("row,words", [
    ({"image": "imgs/0.png", "prompt": "How many?"}, ":1: needs \"answer\""),
    ({"image": "imgs/0.png", "prompt": "How many?", "answer": "three"}, ":1: answer 'three' is not a number"),
    ({"image": "imgs/0.png", "prompt": "How many?", "answer": 3, "label": 3}, ":1: unknown key 'label'"),
    ({"prompt": "How many?", "answer": 3}, ":1: needs \"image\""),
])
def test_bad_qa_rows_name_the_line(tmp_path, capsys, row, words):
    write_images(tmp_path / "imgs")
    (tmp_path / "qa.jsonl").write_text(json.dumps(row) + "\n")
    err = compile_fails(tmp_path, capsys, "evaluate: {suites: [qa], qa: {data: qa.jsonl, scorer: numeric}}\n")
    assert words in err


def test_declared_data_must_be_used_and_used_data_declared(tmp_path, capsys):
    write_images(tmp_path / "imgs")
    err = compile_fails(tmp_path, capsys, "calibration: {images: imgs}\npasses:\n  - awq_int4: {method: rtn}\n")
    assert "declares calibration data but no pass uses it" in err
    err = compile_fails(tmp_path, capsys, f"passes:\n{PASS}")
    assert "passes[0].awq_int4: calibration.images: recipe needs calibration.images or calibration.jsonl" in err
    err = compile_fails(tmp_path, capsys, "budgets: {agreement_top1_drop: 1}\n")
    assert "evaluate.agreement.data" in err


def test_eval_reads_the_data_file_the_same_way(tiny_bundle, tmp_path, capsys):
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n[1, 2]\n')
    assert main(["eval", str(tiny_bundle), "--suite", "qa"]) == 2
    assert "--suite qa needs --data FILE" in capsys.readouterr().err
    assert main(["eval", str(tiny_bundle), "--suite", "agreement", "--data", str(tmp_path / "prompts.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("prompts.jsonl:2: expected a JSON object with keys image, prompt") and len(err.splitlines()) == 1
