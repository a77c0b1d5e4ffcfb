"""The CLI explains itself: help and an example for every command, help for every option with its default,
the closest name for a typo, a short plan for people, and no raw control character on a terminal."""

import argparse
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from mmtrt.cli import build_parser, main
from mmtrt.compare.report import format_report
from mmtrt.runtime import load
from mmtrt.terminal import one_line, printable

COMMANDS = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_a_description_examples_and_help_for_each_argument(name):
    parser = COMMANDS[name]
    assert parser.description and parser.epilog.startswith("examples:\n"), name
    examples = parser.epilog.splitlines()[1:]
    assert examples and all(line.startswith(f"  mmtrt {name} ") for line in examples), parser.epilog
    for action in parser._actions:
        assert action.help, f"mmtrt {name} {action.dest} has no help"
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            shown = formatter._get_help_string(action)
            assert "default" in shown and str(action.default) in shown, (name, action.dest, shown)


@pytest.mark.parametrize("argv, words", [
    (["complie", "r.yaml"], ["unknown command 'complie'", "did you mean `mmtrt compile`?"]),
    (["inpsect", "B"], ["did you mean `mmtrt inspect`?"]),
    (["eval", "B", "--suite", "digit"], ["unknown value for --suite 'digit'", "did you mean 'digits'?"]),
    (["run", "B", "--max-new-tokns", "3"], ["--max-new-tokns", "did you mean --max-new-tokens?"]),
])
def test_a_typo_gets_the_closest_name(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    assert all(w in err for w in words), err


def test_plan_is_a_short_summary_and_json_on_request(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {source: zoo, name: tiny-llava}\n"
                      "passes:\n  - dead_layer_elimination: {}\n  - token_prune: {keep: 16, method: norm}\n")
    assert main(["compile", str(recipe), "--plan"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert len(lines) <= 12 and lines[0] == f"{recipe}: valid; nothing was built (--plan)", text
    for words in ("model       zoo:tiny-llava: clip_vision_model 64x64/8, 64 image tokens; llama 4 layers",
                  '2. token_prune {"keep": 16, "method": "norm"}  (on vision, lossy)',
                  "image tokens per image: 64 -> 16", "backends    preprocess torchvision: any host", "vision tensorrt: a CUDA GPU",
                  "sequences up to 272 tokens", f"next: mmtrt compile {recipe} -o r.bundle"):
        assert words in text, text
    assert main(["compile", str(recipe), "--plan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["image_tokens_after_passes"] == 16


def test_printable_escapes_control_characters_and_keeps_text():
    assert printable("5\x0c\x1b[2J\r\u202eok\ud800") == "5\\x0c\\x1b[2J\\x0d\\u202eok\\ud800"
    assert printable("two\nlines\tand é, 日本, \ufffd") == "two\nlines\tand é, 日本, \ufffd"
    assert one_line("a\nb\tc") == "a\\x0ab\\x09c"


def test_run_on_a_terminal_escapes_what_the_model_says(tiny_bundle):
    """The random tiny model answers the demo's question with a form feed among its bytes: the JSON keeps the
    exact text, the text output escapes it, streamed or not."""
    image, prompt = ROOT / "examples" / "sample.png", "What is in the picture?"
    exact = load(tiny_bundle).generate(image, prompt, 16).text
    assert any(printable(c) != c for c in exact), exact
    proc = subprocess.run([sys.executable, "-m", "mmtrt.cli", "run", str(tiny_bundle), "--image", str(image),
                           "--prompt", prompt, "--max-new-tokens", "16"], capture_output=True, text=True, check=True)
    assert proc.stdout == printable(exact) + "\n"
    assert not [c for c in proc.stdout + proc.stderr if c != "\n" and printable(c) != c], repr(proc.stdout)
    streamed = subprocess.run(proc.args + ["--stream"], capture_output=True, text=True, check=True)
    assert streamed.stdout == proc.stdout, (streamed.stdout, proc.stdout)


def test_inspect_shows_an_unbounded_side_as_any(tiny_bundle, capsys):
    assert main(["inspect", str(tiny_bundle)]) == 0
    text = capsys.readouterr().out
    assert "preprocess.image" in text and "/ [any, any, 3]" in text and "None" not in text, text


@pytest.mark.parametrize("iterations, words", [(1, "(one iteration)"), (3, "(medians of 3 iterations)")])
def test_compare_counts_its_iterations_in_words(iterations, words):
    partition = {"comparable": True, "runners": {"a": "onnxruntime", "b": "onnxruntime"},
                 "median_ms": {"a": 1.0, "b": 2.0}, "iterations": iterations, "outputs": {}}
    report = {"tolerances": {"atol": 1e-5, "rtol": 1e-5}, "a": {"bundle": "A"}, "b": {"bundle": "B"},
              "partitions": {"llm": partition}, "differences": [], "passed": True}
    assert words in format_report(report)
