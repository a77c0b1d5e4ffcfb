"""The qa scorers on known answers, near misses included: what each says of "7." and "seven" for 7."""

import pytest

from mmtrt.eval.scorers import contains, exact, first_number, normalise, numeric

# answer, label, tolerance, exact, contains, numeric
CASES = [
    ("7", "7", 0, True, True, True),
    ("7.", "7", 0, True, True, True),          # a trailing full stop is punctuation, not part of the answer
    ("seven", "7", 0, False, False, False),    # number words are not read, by any scorer
    ("Seven", "seven", 0, True, True, False),  # as text they match; numeric needs a number in the label
    (" The answer is 7. ", "7", 0, False, True, True),
    ("17", "7", 0, False, False, False),       # contains needs whole words; 17 is not 7
    ("7 apples", "7", 0, False, True, True),
    ("about 7.4", "7", 0.5, False, False, True),
    ("7.6", "7", 0.5, False, False, False),
    ("3.7", "7", 0, False, False, False),
    ("6.5", "7", 0.5, False, False, True),     # the tolerance is inclusive
    ("-3", "-3", 0, True, True, True),
    ("1,000 metres", "1000", 0, False, False, True),
    ("A red car", "red car", 0, False, True, False),
    ("PARIS!", "Paris", 0, True, True, False),
    ("", "7", 0, False, False, False),
]


@pytest.mark.parametrize("answer,label,tol,want_exact,want_contains,want_numeric", CASES)
def test_scorers_on_known_answers(answer, label, tol, want_exact, want_contains, want_numeric):
    assert exact(answer, label, tol) is want_exact
    assert contains(answer, label, tol) is want_contains
    assert numeric(answer, label, tol) is want_numeric


def test_normalise_and_first_number():
    assert normalise("  It IS\n  7.  ") == "it is 7"
    assert first_number("7.") == 7.0
    assert first_number("x=2.5e3, then 4") == 2500.0
    assert first_number("seven") is None
