"""The boxed-answer checker: extraction, math-verify equivalence, bounded cost, thread safety."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from scalectl.rl.reward.checker import answers_match, check, last_boxed, reward, too_costly


def test_last_boxed():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{12} then \\boxed{3") == "12"      # unclosed last one: the earlier
    assert last_boxed("no box") is None
    assert last_boxed("\\boxed{") is None
    assert last_boxed("\\boxed{}") == ""


@pytest.mark.parametrize("text,gold,expected", [
    ("55;-8;\\boxed{-8}", "-8", True),
    ("\\boxed{ 363 }", "363", True),
    ("\\boxed{363.0}", "363", True),              # math-verify: numerically equal
    ("\\boxed{\\frac{726}{2}}", "363", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{- 8}", "-8", True),
    ("\\boxed{362}", "363", False),
    ("\\boxed{8}", "-8", False),
    ("\\boxed{363", "363", False),                # not closed
    ("363", "363", False),                        # no box
    ("\\boxed{}", "363", False),
    ("\\boxed{}{}}", "363", False),
    ("\\boxed{36}3", "363", False),
])
def test_check(text, gold, expected):
    assert check(text, gold) is expected
    assert reward(text, gold) == (1.0 if expected else -1.0)


@pytest.mark.parametrize("answer", ["10^{10^{10}}", "2^{100000000}", "100000!", "9" * 101, "2^2^2^2^2^2^2^2^2^2"])
def test_costly_answers_score_false_without_parsing(answer):
    assert too_costly(answer)
    assert check("\\boxed{" + answer + "}", "3") is False


def test_ordinary_answers_are_not_costly():
    for a in ["363", "-8", "2^{10}", "\\frac{\\sqrt{3}}{2}", "x^2+y^2", "120!"[:3]]:
        assert not too_costly(a)
    assert answers_match("2^{10}", "1024")


def test_checker_works_in_threads():
    cases = [("\\boxed{363.0}", "363", True), ("\\boxed{\\frac{1}{2}}", "0.5", True),
             ("\\boxed{7}", "8", False)] * 20
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda c: check(c[0], c[1]), cases))
    assert got == [c[2] for c in cases]
