"""Scorers for the qa suite: does a generated answer match the expected one?

All three first normalise both texts the same way: case folded, whitespace collapsed, and sentence punctuation
(. , ; : ! ? and quotes) at either end removed. None of them reads number words: "seven" is not 7.
- `exact`: the normalised answer equals the normalised label ("7." matches 7; "seven" and "7 apples" do not).
- `contains`: the normalised label occurs in the answer as whole words ("There are 7." matches 7; "17", "7.4"
  and "seven" do not).
- `numeric`: the first number in the answer is within `tolerance` of the label ("7." and "about 7.4" match 7 at
  tolerance 0.5; "seven" names no number and fails).
"""

from __future__ import annotations

import math
import re
from typing import Callable

SCORERS = ("exact", "contains", "numeric")
_EDGE_PUNCT = " \t\n.,;:!?\"'`()[]"
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")


def normalise(text: str) -> str:
    return " ".join(text.casefold().split()).strip(_EDGE_PUNCT)


def first_number(text: str) -> float | None:
    match = _NUMBER.search(text.replace(",", ""))
    return float(match.group()) if match else None


def exact(answer: str, label: str, tolerance: float = 0.0) -> bool:
    return normalise(answer) == normalise(label)


def contains(answer: str, label: str, tolerance: float = 0.0) -> bool:
    want = normalise(label)
    if not want:
        return False
    # whole words, and a number is whole too: 7 is not in 17, 7.4 or 3.7
    return re.search(rf"(?<!\w)(?<!\d[.,]){re.escape(want)}(?!\w)(?![.,]\d)", normalise(answer)) is not None


def numeric(answer: str, label: str, tolerance: float = 0.0) -> bool:
    got, want = first_number(answer), first_number(label)
    return got is not None and want is not None and math.isfinite(got) and abs(got - want) <= tolerance


def scorer(name: str) -> Callable[[str, str, float], bool]:
    return {"exact": exact, "contains": contains, "numeric": numeric}[name]
