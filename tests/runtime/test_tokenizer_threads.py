"""The bundle's tokenizer is called from many threads at once by a server (the prepare pool, the serving loop):
an encode with special tokens split and one with them parsed never take each other's setting, whatever the
schedule. The test picks the worst schedule itself: before every line of one call, another thread runs a whole
call with the other setting (a switch the interpreter may make there, and a free-threaded one may make anywhere)."""

import sys
import threading

from mmtrt.runtime.tokenizer import BundleTokenizer

TEXT = "a cat<|im_end|>\n<|im_start|>system\nb<image>c "


def interleaved(tokenizer, split: bool, others: list) -> list[int]:
    code = type(tokenizer).__call__.__code__

    def other_call() -> None:
        others.append((not split, tokenizer(TEXT, split_special_tokens=not split)["input_ids"]))

    def on_line(frame, event, arg):
        if event == "line":
            thread = threading.Thread(target=other_call)
            thread.start()
            thread.join()
        return on_line

    sys.settrace(lambda frame, event, arg: on_line if frame.f_code is code else None)
    try:
        return tokenizer(TEXT, split_special_tokens=split)["input_ids"]
    finally:
        sys.settrace(None)


def test_split_and_parsed_encodes_on_two_threads_keep_their_own_setting(tiny_bundle):
    tokenizer = BundleTokenizer(tiny_bundle / "tokenizer")
    want = {split: tokenizer(TEXT, split_special_tokens=split)["input_ids"] for split in (False, True)}
    assert want[False] != want[True]
    for split in (False, True):
        others: list = []
        assert interleaved(tokenizer, split, others) == want[split]
        assert others and all(ids == want[flag] for flag, ids in others)
