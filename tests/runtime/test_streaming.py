"""Text as tokens come: deltas that add up to the whole decode, whole characters only, stop strings cut right."""

import json

import numpy as np
import pytest

from builders import random_image
from mmtrt.cli import main
from mmtrt.runtime import load
from mmtrt.runtime.sampling import SamplingParams
from mmtrt.runtime.streaming import REPLACEMENT, TextStream
from mmtrt.runtime.tokenizer import BundleTokenizer

PIECES = ["the", " cat", "é", "ü", "日本", "😀", "ß", "\n", "##", " 42", "!", "∑"]


@pytest.fixture(scope="module")
def tokenizer(tiny_bundle):
    return BundleTokenizer(tiny_bundle / "tokenizer")


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def stream(tokenizer, ids, stop=()):
    text = TextStream(tokenizer, stop)
    deltas = [text.push(i) for i in ids]
    return deltas, text.flush(), text


def test_deltas_add_up_to_the_whole_decode_and_never_split_a_character(tokenizer, rng):
    for _ in range(20):
        words = "".join(rng.choice(PIECES, int(rng.integers(1, 12))))
        ids = encode(tokenizer, words)
        deltas, rest, _ = stream(tokenizer, ids)
        assert "".join(deltas) + rest == tokenizer.decode(ids, skip_special_tokens=True) == words
        assert not any(REPLACEMENT in d for d in deltas)
    ids = encode(tokenizer, "a😀b")  # a byte-level vocabulary: the emoji is four tokens, shown once complete
    assert len(ids) == 6 and stream(tokenizer, ids)[0] == ["a", "", "", "", "😀", "b"]


def test_random_tokens_with_invalid_bytes_still_add_up_to_the_whole_decode(tokenizer, rng):
    for _ in range(20):
        ids = [int(i) for i in rng.integers(0, 256, int(rng.integers(1, 30)))]
        deltas, rest, _ = stream(tokenizer, ids)
        assert "".join(deltas) + rest == tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("text, stops, want", [
    ("The answer is 42.\n\nQuestion: next", ("\n\nQuestion",), "The answer is 42."),
    ("a#b##c###d", ("###", "##"), "a#b"),  # the earliest of several, each spanning tokens
    ("###d", ("###",), ""),
    ("日本語です", ("語",), "日本"),  # a stop inside multi-byte characters
    ("no stop here #", ("##",), "no stop here #"),  # a held-back possible start is released at the end
])
def test_stop_strings_cut_the_text_even_across_token_boundaries(tokenizer, text, stops, want):
    ids = encode(tokenizer, text)
    deltas, rest, state = stream(tokenizer, ids, stops)
    assert "".join(deltas) + rest == state.text == want
    assert state.stopped == (want != text)
    for n in range(len(ids)):  # nothing past the cut was ever shown, at any step
        assert want.startswith("".join(deltas[:n + 1]))


def test_stream_and_callback_give_the_generation_token_by_token(tiny_static_bundle, rng):
    pipe = load(tiny_static_bundle)
    image = random_image(rng, 40, 56)
    sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=int(rng.integers(2**32)))
    whole = pipe.generate(image, "Describe it.", 20, sampling=sampling)
    deltas = list(pipe.stream(image, "Describe it.", 20, sampling=sampling))
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids
    assert "".join(d.text for d in deltas) == whole.text
    assert [d.finish_reason for d in deltas] == [None] * (len(deltas) - 1) + [whole.finish_reason]
    seen = []
    assert pipe.generate(image, "Describe it.", 20, sampling=sampling, on_delta=seen.append).token_ids == \
        whole.token_ids and seen == deltas


def test_stop_strings_end_generation_with_finish_reason_stop(tiny_bundle):
    pipe = load(tiny_bundle)
    image = random_image(np.random.default_rng(5), 48, 48)  # fixed: its text has clean pieces to stop at
    full = pipe.generate(image, "Go on.", 32, sampling=SamplingParams(temperature=1.0, seed=7))
    text = full.text
    stop = next(text[i:i + 2] for i in range(4, len(text) - 2) if REPLACEMENT not in text[i:i + 2])
    cut = pipe.generate(image, "Go on.", 32, sampling=SamplingParams(temperature=1.0, seed=7, stop=(stop,)))
    assert cut.text == text[:text.index(stop)] and cut.finish_reason == "stop"
    assert cut.token_ids == full.token_ids[:len(cut.token_ids)] and len(cut.token_ids) < len(full.token_ids)


def test_run_stream_prints_json_lines_and_sampling_flags_are_checked(tiny_bundle, tmp_path, rng, capsys):
    random_image(rng, 40, 40).save(tmp_path / "a.png")
    args = ["run", str(tiny_bundle), "--image", str(tmp_path / "a.png"), "--prompt", "Hi", "--max-new-tokens", "6",
            "--temperature", "0.8", "--seed", "11", "--top-k", "50", "--stop", "never-seen"]
    assert main(args + ["--stream", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(args + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [t for line in lines for t in line["token_ids"]] == result["token_ids"]
    assert "".join(line["text"] for line in lines) == result["text"]
    assert lines[-1]["finish_reason"] == result["finish_reason"] and len(lines) == len(result["token_ids"])
    for flag, value, field in (("--top-p", "0", "top_p"), ("--temperature", "-1", "temperature"),
                               ("--seed", "-3", "seed"), ("--repetition-penalty", "0", "repetition_penalty")):
        assert main(args[:-2] + [flag, value]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"mmtrt: error: sampling: {field} ") and err.count("\n") == 1
