"""The answer checker on a table of equal and unequal (answer, gold) pairs.

Both sides are normalised alike (trailing punctuation, thousands separators written with a
comma, LaTeX spacing or a space, a percent sign only where the gold has one); math-verify
judges the rest.  Anything ambiguous is rejected: a checker that accepts wrong answers is a
reward-hacking surface.
"""

from __future__ import annotations

import pytest

from scalectl.rl.reward.checker import answers_match, canonical_answer, check, without_thousands

#: (model's boxed answer, gold answer, equal?)
TABLE = [
    # percent signs: only where the gold has one
    ("5\\%", "5", False),
    ("5%", "5", False),
    ("50\\%", "0.5", False),
    ("5", "5\\%", True),
    ("5\\%", "5\\%", True),
    ("5%", "5\\%", True),
    ("0.05", "5\\%", False),
    ("0.5", "50\\%", False),
    # trailing punctuation
    ("3.", "3", True),
    ("3;", "3", True),
    ("3 .", "3", True),
    ("\\frac{1}{2}.", "\\frac{1}{2}", True),
    ("3.", "3.5", False),
    ("3!", "6", True),                     # a factorial, not punctuation
    # thousands separators: comma, LaTeX {,} and \,, a space; groups of exactly three digits
    ("1 000", "1000", True),
    ("1{,}000", "1000", True),
    ("1\\,000", "1000", True),
    ("1,000", "1000", True),
    ("12 345", "12345", True),
    ("1 000 000", "1000000", True),
    ("1,000,000", "10^6", True),
    ("1,000.5", "1000.5", True),
    ("1000", "1 000", True),
    ("1 0000", "10000", False),
    ("3 3", "33", False),
    ("1,2", "12", False),
    ("12", "1,2", False),
    ("1,00", "100", False),
    ("1,000 000", "1000000", False),       # two kinds of separator: ambiguous
    # numbers and forms math-verify judges
    ("\\frac{6}{2}", "3", True),
    ("6/2", "3", True),
    ("3.0", "3", True),
    ("03", "3", True),
    ("\\dfrac{1}{2}", "0.5", True),
    ("\\sqrt{9}", "3", True),
    ("x=3", "3", True),
    ("\\$18", "18", True),
    ("-3", "3", False),
    ("2.99", "3", False),
    ("0.333", "\\frac{1}{3}", False),
    ("\\pi", "3.14", False),
    # several values where one is asked, and tuples
    ("3,5", "3", False),
    ("3 or 5", "3", False),
    ("\\{3,5\\}", "3", False),
    ("(2,1)", "(1,2)", False),
    ("(1,2)", "(1,2)", True),
    ("18 dollars", "18", False),
    ("", "3", False),
    (".", "3", False),
]


def test_the_table_is_large_and_balanced():
    assert len(TABLE) >= 40 and len({(a, g) for a, g, _ in TABLE}) == len(TABLE)
    assert sum(ok for *_, ok in TABLE) >= 15 and sum(not ok for *_, ok in TABLE) >= 15


@pytest.mark.parametrize("answer, gold, equal", TABLE)
def test_pair(answer, gold, equal):
    assert answers_match(answer, gold, timeout=5.0) is equal
    assert check(f"so the answer is \\boxed{{{answer}}}", gold, timeout=5.0) is equal


def test_canonical_form():
    assert canonical_answer(" 5\\%. ") == ("5", True)
    assert canonical_answer("1 000") == ("1000", False)
    assert canonical_answer("3!") == ("3!", False)
    assert without_thousands("-12{,}345.5") == "-12345.5"
    assert without_thousands("1,2") == "1,2" and without_thousands("(1,000)") == "(1,000)"
