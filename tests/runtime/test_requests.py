"""`mmtrt run --requests`: a bad line is refused alone with its own number, every good line's result comes back in
order equal to its solo run, images resolve beside the file, and the command's flags are not silently ignored."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import random_image
from mmtrt.cli import main
from mmtrt.errors import UserError
from mmtrt.runtime import load
from mmtrt.runtime.batch import Request
from mmtrt.runtime.requests import read_requests

BAD_LINES = {
    "integer image": b'{"image": 7, "prompt": "hi"}',
    "lone surrogate": b'{"image": "a.png", "prompt": "hi \\ud800"}',
    "not UTF-8": b'{"image": "a.png", "prompt": "caf\xe9"}',
    "null prompt": b'{"image": "a.png", "prompt": null}',
    "string raw_prompt": b'{"image": "a.png", "prompt": "hi", "raw_prompt": "false"}',
    "not JSON": b'{"image": "a.png", "prompt": ',
    "extra key": b'{"image": "a.png", "prompt": "hi", "temperature": 0}',
    "float tokens": b'{"image": "a.png", "prompt": "hi", "max_new_tokens": 2.0}',
    "no such image": b'{"image": "missing.png", "prompt": "hi"}',
    "zero tokens": b'{"image": "a.png", "prompt": "hi", "max_new_tokens": 0}',
}
REASONS = {"integer image": "image must be a string (the image's path), not 7",
           "lone surrogate": "prompt holds a lone surrogate (\\ud800)", "not UTF-8": "is not UTF-8 text (byte 0xe9",
           "null prompt": "prompt must be a string, not null", "string raw_prompt": 'raw_prompt must be true or false',
           "not JSON": "is not JSON", "extra key": "nothing else", "float tokens": "max_new_tokens must be an integer",
           "no such image": "missing.png does not exist", "zero tokens": "max_new_tokens 0 is outside 1..32"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import numpy as np

    path = tmp_path_factory.mktemp("requests")
    rng = np.random.default_rng(5)
    random_image(rng, 40, 52).save(path / "a.png")
    random_image(rng, 61, 33).save(path / "b.png")
    return path


@pytest.fixture(scope="module")
def solo(tiny_bundle, folder):
    """Each good request's tokens, run alone through the Python API."""
    pipe, done = load(tiny_bundle, threads=1), {}

    def run(image, prompt, tokens):
        key = (image, prompt, tokens)
        if key not in done:
            done[key] = pipe.generate(folder / image, prompt, tokens).token_ids
        return done[key]
    return run


def test_every_bad_line_is_refused_alone_with_its_line_number(folder):
    path = folder / "bad.jsonl"
    path.write_bytes(b"\n".join([b"", *BAD_LINES.values(), b'{"image": "a.png", "prompt": "hi"}']) + b"\n")
    parsed = read_requests(path)
    assert len(parsed) == len(BAD_LINES) + 1 and parsed[-1] == Request(str(folder / "a.png"), "hi")
    for number, (kind, result) in enumerate(zip(BAD_LINES, parsed), 2):
        if kind in ("no such image", "zero tokens"):  # well-formed: the runtime refuses them
            assert isinstance(result, Request), kind
        else:
            assert isinstance(result, str) and result.startswith(f"line {number}") and REASONS[kind] in result, result


def test_an_empty_file_is_an_error(folder):
    (folder / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(UserError, match="holds no requests"):
        read_requests(folder / "empty.jsonl")


def test_flags_beside_requests(tiny_bundle, folder, solo, capsys):
    path = folder / "two.jsonl"
    path.write_text('{"image": "a.png", "prompt": "hi"}\n{"image": "b.png", "prompt": "hi", "max_new_tokens": 2}\n')
    assert main(["run", str(tiny_bundle), "--requests", str(path), "--image", "a.png"]) == 2
    assert "give either --requests or --image and --prompt" in capsys.readouterr().err
    assert main(["run", str(tiny_bundle), "--requests", str(path), "--max-new-tokens", "3", "--json"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["token_ids"] for r in out] == [solo("a.png", "hi", 3), solo("b.png", "hi", 2)]


GOOD = st.tuples(st.sampled_from(["a.png", "b.png"]), st.sampled_from(["hi", "What colour is it?"]),
                 st.integers(1, 3), st.booleans())


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(GOOD, st.sampled_from(sorted(BAD_LINES))), min_size=1, max_size=6))
def test_fuzz_good_lines_come_back_in_order_equal_to_their_solo_run(tiny_bundle, folder, solo, lines):
    """Good and bad lines mixed: one result per line, in order; good ones equal their solo run."""
    text = []
    for line in lines:
        if isinstance(line, str):
            text.append(BAD_LINES[line])
        else:
            image, prompt, tokens, absolute = line
            where = str(folder / image) if absolute else image
            text.append(json.dumps({"image": where, "prompt": prompt, "max_new_tokens": tokens}).encode())
    path = folder / "fuzz.jsonl"
    path.write_bytes(b"\n".join(text) + b"\n")
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", str(tiny_bundle), "--requests", str(path), "--json"])
    results = [json.loads(r) for r in out.getvalue().splitlines()]
    assert len(results) == len(lines) and "Traceback" not in err.getvalue()
    for number, (line, result) in enumerate(zip(lines, results), 1):
        if isinstance(line, str):
            assert result["error"].startswith(f"request {number}: ") and REASONS[line] in result["error"], result
        else:
            assert result["token_ids"] == solo(line[0], line[1], line[2])
    assert code == (2 if any(isinstance(line, str) for line in lines) else 0)
    assert len(err.getvalue().splitlines()) == sum(isinstance(line, str) for line in lines)
