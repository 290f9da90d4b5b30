"""The answer checker on tables of equal and unequal (answer, gold) pairs and of completions.

Both sides are normalised alike (trailing punctuation, thousands separators written with a
comma, LaTeX spacing or a space, a percent sign only where the gold has one); numbers in
any notation are compared here with a relative tolerance, letters as written (case and
units); math-verify judges the rest.  Anything ambiguous is rejected: a checker that accepts
wrong answers is a reward-hacking surface.  A gold may list several answers, and with think
tags only the text after the last ``</think>`` is graded.
"""

from __future__ import annotations

import pytest

from fractions import Fraction

from scalectl.rl.reward.checker import answers_match, canonical_answer, check, reward, without_thousands
from scalectl.rl.reward.gold import Gold, graded_text
from scalectl.rl.reward.numbers import REL_TOL, close, compare_literals, literal_value, with_unit, without_e_notation
from scalectl.rl.reward.written import letter_tokens

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

#: (answer, gold, equal?): numbers in every notation, a relative tolerance, letters as written
NEW_PAIRS = [
    # one number, every notation: e-notation, \times 10^{}, \cdot 10^{}, a bare power of ten
    ("4.4e7", "4.4 \\times 10^{7}", True),
    ("4.4 \\times 10^{7}", "4.4e7", True),
    ("4.4\\times10^7", "4.4e7", True),
    ("4.4 \\cdot 10^{7}", "4.4e7", True),
    ("4.4E+07", "4.4 \\times 10^{7}", True),
    ("44 \\times 10^{6}", "4.4e7", True),
    ("44000000", "4.4\\cdot10^{7}", True),
    ("4.4 × 10^7", "4.4e7", True),
    ("1.6e-19", "1.6 \\times 10^{-19}", True),
    ("-2.5e-3", "-0.0025", True),
    ("10^{-3}", "1e-3", True),
    ("\\num{3e8}", "3 \\times 10^{8}", True),
    ("3.0\\,\\times\\,10^{8}", "3e8", True),
    ("(1.5e-19, 2)", "(1.5\\times10^{-19}, 2)", True),
    ("4.4e7", "4.4 \\times 10^{8}", False),
    ("4.4e-7", "4.4 \\times 10^{7}", False),
    ("4.5e7", "4.4e7", False),
    ("6.022e23", "6.02\\times10^{23}", False),
    # a relative tolerance (1e-9) at every magnitude
    ("2e-19", "1e-19", False),
    ("1 \\times 10^{-19}", "2 \\times 10^{-19}", False),
    ("0.0000002", "0.0000001", False),
    ("1.0000002", "1.0000001", False),
    ("1e-30", "0", False),
    ("0.0", "0", True),
    ("1.00000001", "1.0", False),                    # 1e-8 apart: over the tolerance
    ("1.0000000001", "1.0", True),                   # 1e-10 apart: within it
    ("0.333333", "\\frac{1}{3}", False),             # a rounding is not the value
    ("0.3333333333333", "\\frac{1}{3}", True),
    ("1.4142135623731 \\times 10^{-19}", "\\sqrt{2} \\times 10^{-19}", True),
    ("1.414 \\times 10^{-19}", "\\sqrt{2} \\times 10^{-19}", False),
    ("(1e-19, 2)", "(2e-19, 2)", False),
    ("1.23456789e12", "1234567890123", False),     # a gold written as an integer is a count: exact
    ("1234567890123", "1234567890124", False),
    ("1.234567890123e12", "1234567890123", True),
    # symbols and units as written: case and a unit letter change the answer
    ("x", "X", False),
    ("X", "x", False),
    ("2X + 1", "2x + 1", False),
    ("b", "B", False),
    ("\\text{B}", "B", True),
    ("\\text{Paris}", "\\text{paris}", False),
    ("5\\text{ m}", "5\\text{ km}", False),
    ("5\\text{ mm}", "5\\text{ m}", False),
    ("5 mm", "5 m", False),
    ("5\\,\\mathrm{mA}", "5\\,\\mathrm{MA}", False),
    ("3\\,\\text{kg}", "3\\,\\text{Kg}", False),
    ("5\\,\\Omega", "5\\,\\omega", False),
    ("1\\text{ kJ}", "1000\\text{ J}", False),           # units are not converted
    ("5\\text{ m}", "5", True),                           # a unit the gold does not name is ignored
    ("5\\,\\mathrm{m}", "5\\text{ m}", True),
    ("4.4e7\\text{ m/s}", "4.4\\times 10^{7}\\mathrm{~m/s}", True),
    ("4.4\\times 10^{7}", "4.4\\times 10^{7}\\mathrm{~m/s}", True),   # the gold's unit left out
    ("90^{\\circ}", "90^\\circ", True),
    ("2yx", "2xy", True),
    ("x(x+2y)", "x^2+2xy", True),
    ("\\frac{x}{2}", "0.5x", True),
    ("3+4i", "4i+3", True),
    ("f(x) = 2x", "2x", True),                        # an assignment names nothing
    ("y = 3X", "3x", False),
]


#: (completion, gold, right?): several gold answers, and think tags
COMPLETIONS = [
    ("\\boxed{x=4}", Gold(("4", "x=4")), True),
    ("\\boxed{5}", Gold(("4", "5")), True),
    ("\\boxed{3}", Gold(("4", "5")), False),
    ("\\boxed{0.5}", Gold(("\\frac{1}{2}", "50\\%")), True),
    ("\\boxed{50\\%}", Gold(("\\frac{1}{2}", "50\\%")), True),
    ("\\boxed{5\\%}", Gold(("\\frac{1}{2}", "50\\%")), False),
    ("\\boxed{4.4e7}", Gold(("4.4 \\times 10^{7}", "44\\,\\text{Mm/s}")), True),
    ("<think>2+2 is 4</think> So \\boxed{4}.", Gold(("4",), think_tags=True), True),
    ("<think>so \\boxed{4}", Gold(("4",), think_tags=True), False),            # an unfinished block
    ("the template opened it... so \\boxed{4}", Gold(("4",), think_tags=True), False),  # never closed
    ("...and so</think> \\boxed{4}", Gold(("4",), think_tags=True), True),     # opened by the template
    ("<think>\\boxed{4}</think> hence \\boxed{5}", Gold(("4",), think_tags=True), False),
    ("<think>\\boxed{5}</think> hence \\boxed{4}", Gold(("4",), think_tags=True), True),
    ("<think>a</think> b <think>c</think> \\boxed{4}", Gold(("4",), think_tags=True), True),
    ("<think>a</think> \\boxed{4} <think>more", Gold(("4",), think_tags=True), False),  # reopened, unfinished
    ("<think>a</think> the answer is 4", Gold(("4",), think_tags=True), False),  # no box after the block
    ("<think>4 or 5?</think> \\boxed{5}", Gold(("4", "5"), think_tags=True), True),
    ("<think>so \\boxed{4}", "4", False),                                       # no think tags: an unclosed block is cut
    ("<think>so \\boxed{4}", Gold(("4",)), False),
    ("<think>so 3</think>\\boxed{4}", "4", True),                              # no think tags: a closed block is text
]


def test_the_tables_are_large_and_balanced():
    assert len(TABLE) >= 40 and len({(a, g) for a, g, _ in TABLE}) == len(TABLE)
    assert sum(ok for *_, ok in TABLE) >= 15 and sum(not ok for *_, ok in TABLE) >= 15
    pairs = {(a, g) for a, g, _ in TABLE + NEW_PAIRS}
    assert len(NEW_PAIRS) >= 55 and len(pairs) == len(TABLE) + len(NEW_PAIRS)
    assert sum(ok for *_, ok in NEW_PAIRS) >= 20 and sum(not ok for *_, ok in NEW_PAIRS) >= 20
    assert len(COMPLETIONS) >= 15 and sum(ok for *_, ok in COMPLETIONS) >= 7


@pytest.mark.parametrize("answer, gold, equal", TABLE + NEW_PAIRS)
def test_pair(answer, gold, equal):
    assert answers_match(answer, gold, timeout=5.0) is equal
    assert check(f"so the answer is \\boxed{{{answer}}}", gold, timeout=5.0) is equal
    assert check(f"<think>maybe 0</think> so \\boxed{{{answer}}}", Gold((gold,), think_tags=True)) is equal


@pytest.mark.parametrize("completion, gold, right", COMPLETIONS)
def test_completion(completion, gold, right):
    assert check(completion, gold, timeout=5.0) is right
    assert reward(completion, gold, timeout=5.0) == (1.0 if right else -1.0)


@pytest.mark.parametrize("completion, right", [
    ("<think>so \\boxed{42}", False),                         # cut at the length limit while thinking
    ("hmm <think>x is \\boxed{42} or", False),
    ("\\boxed{42} <think>or 41", True),                        # answered, then began to think again
    ("<think>41?</think> so \\boxed{42}", True),                # a closed block: graded whole, as before
    ("<think>\\boxed{42}</think>", True),
    ("<think>a</think> \\boxed{42} <think>\\boxed{41}", True),  # only the unclosed last block is cut
    ("\\boxed{42}", True),
])
def test_an_unclosed_thinking_block_is_not_graded_without_think_tags(completion, right):
    assert check(completion, "42") is right


def test_graded_text_and_gold():
    assert graded_text("<think>a</think>b</think>c", think_tags=True) == "c"
    assert graded_text("<think>a", think_tags=True) is None and graded_text("<think>a", think_tags=False) == ""
    assert str(Gold(("4", "x=4"))) == "4 | x=4"
    for bad in ((), ("4", 4), [None]):
        with pytest.raises(ValueError, match="one or more string answers"):
            Gold(bad)


def test_relative_tolerance_is_relative_at_every_magnitude():
    # 1 + 1e-10 and 1 + 1e-8 scaled by 10^k: equal and unequal at every magnitude (exact arithmetic)
    for k in (-300, -19, -7, 0, 7, 19, 300):
        assert compare_literals(f"1.0000000001e{k}", f"1e{k}") is True, k
        assert compare_literals(f"1.00000001e{k}", f"1e{k}") is False, k
        assert compare_literals(f"2 \\times 10^{{{k}}}", f"1 \\times 10^{{{k}}}") is False, k
    # |1/3 - 0.33333333| / (1/3) = 1e-8 exactly (over); with ten 3s, 1e-10 (within); nine: 1e-9 (the edge)
    assert REL_TOL == 1e-9 and close(Fraction(1, 3), Fraction(33333333, 10**8)) is False
    assert close(Fraction(1, 3), Fraction(3333333333, 10**10)) is True
    assert close(Fraction(1, 3), Fraction(333333333, 10**9)) is True


def test_number_literals_and_units():
    assert literal_value("4.4 \\times 10^{7}") == literal_value("4.4e7") == literal_value("44000000") == 44_000_000
    assert literal_value("10^{-3}") == Fraction(1, 1000) and literal_value("−2.5e−3") == Fraction(-1, 400)
    for not_one in ("2x", "\\frac{1}{2}", "1e99999", "10^12", "e7", "1,000"):
        assert literal_value(not_one) is None, not_one
    assert with_unit("4.4e7\\,\\mathrm{~m/s}") == (44_000_000, "m/s", True)
    assert with_unit("336^{\\circ}") == (336, "°", True) and with_unit("\\SI{5}{km}") == (5, "km", True)
    assert with_unit("5 mm") == (5, "mm", False) and with_unit("3\\sqrt{2}") is None
    assert without_e_notation("(1.6e-19, x2e3, 2e)") == "(1.6\\times 10^{-19}, x2e3, 2e)"
    assert letter_tokens("5\\,\\text{km}") == {"km"} and letter_tokens("x^2+2xy") == {"x", "y"}
    assert letter_tokens("y = 3\\Omega + \\frac{\\sqrt{3}}{\\sin 2}") == {"\\Omega"}


def test_canonical_form():
    assert canonical_answer(" 5\\%. ") == ("5", True)
    assert canonical_answer("1 000") == ("1000", False)
    assert canonical_answer("3!") == ("3!", False)
    assert without_thousands("-12{,}345.5") == "-12345.5"
    assert without_thousands("1,2") == "1,2" and without_thousands("(1,000)") == "(1,000)"
