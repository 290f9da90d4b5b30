"""The answer checker and the reward: +1 for a correct final answer, -1 otherwise.

The final answer is the content of the LAST ``\\boxed{...}`` of the graded text (braces
balanced; or, with ``reward.format``, what follows the last ``####`` or the last line:
:mod:`scalectl.rl.reward.formats`): the whole completion, or with think tags only what follows the last
``</think>`` (:func:`scalectl.rl.reward.gold.graded_text`: an unfinished thinking block
has no answer).  The gold is a string or a :class:`~scalectl.rl.reward.gold.Gold` of
several acceptable answers; the completion is right when its answer equals any of them.

Two answers are compared (:func:`answers_match`) in steps, each of which may decide:

1. both are normalised alike (:func:`canonical_answer`): surrounding whitespace and
   trailing punctuation go (``3.`` is 3), thousands separators go when every group has
   three digits (``1,000``, ``1{,}000``, ``1\\,000``, ``1 000``), and a trailing percent
   sign is set apart.  A percent sign counts only where the gold has one: an answer with
   one against a gold without (``5\\%`` for 5, ``50\\%`` for 0.5) is wrong, and a gold
   with one is compared by its number (``5`` or ``5\\%`` for ``5\\%``, not ``0.05``).  The
   same string is equal;
2. numbers (:mod:`scalectl.rl.reward.numbers`): two number literals in any notation
   (``4.4e7``, ``4.4 \\times 10^{7}``, ``4.4\\cdot10^7``, ``44000000``) are read exactly and
   compared with a relative tolerance of 1e-9, with units compared as written;
3. letters as written (:mod:`scalectl.rl.reward.written`): when both answers name
   something, they must name the same things, case included (``x`` is not ``X``,
   ``\\text{mA}`` is not ``\\text{MA}``), which math-verify, lowercasing, does not see;
4. a guard: an answer longer than :data:`MAX_ANSWER_CHARS`, with a nested exponent
   (``10^{10^{10}}`` does not return) or with an integer of more than
   :data:`MAX_EXPONENT_DIGITS` digits in an exponent or a factorial (``2^{100000000}``:
   > 1 s) scores False without being parsed;
5. math-verify, ``verify(parse(gold), parse(answer))``, the checker of record for the rest,
   in a checker process bounded by ``timeout`` seconds (:mod:`scalectl.rl.reward.workers`),
   e-notation rewritten as ``\\times 10^{}`` for it, and numbers it calls equal held to
   the same relative tolerance (:mod:`scalectl.rl.reward.mathverify`).

A checker that accepts wrong answers is a reward-hacking surface, so what stays ambiguous
is rejected.  Any exception inside math-verify scores False.  Never raises on a completion.
"""

from __future__ import annotations

import re

from scalectl.rl.reward.formats import final_answer, last_boxed  # noqa: F401 - last_boxed: a public name here
from scalectl.rl.reward.gold import Gold, graded_text
from scalectl.rl.reward.numbers import MAX_EXPONENT_DIGITS, compare_literals, without_e_notation
from scalectl.rl.reward.score import Score
from scalectl.rl.reward.workers import CheckTimeout, verify_bounded
from scalectl.rl.reward.written import same_letters

#: Longest boxed answer (characters) that is parsed at all.
MAX_ANSWER_CHARS = 100
#: Seconds one math-verify comparison (parse + verify, in a worker process) may take.
CHECK_TIMEOUT_S = 5.0

_BIG_POWER = re.compile(r"(\^|\*\*)\s*\{?\s*[-+]?\d{%d,}" % (MAX_EXPONENT_DIGITS + 1))
_BIG_FACTORIAL = re.compile(r"\d{%d,}\s*!" % (MAX_EXPONENT_DIGITS + 1))
_NESTED_POWER = re.compile(r"(\^|\*\*)\s*\{[^{}]*(\^|\*\*)")
#: one separator kind between groups of exactly three digits: , {,} \, \; \: \! \  ~ or a space
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?P<sep>,|\{,\}|\\[,;:! ]|~| )\d{3}(?:(?P=sep)\d{3})*(?:\.\d+)?")
_SEPARATORS = re.compile(r",|\{,\}|\\[,;:! ]|~| ")
_TRAILING_PUNCTUATION = re.compile(r"(?<=\S)\s*[.,;:?]+$")    # not "!": a factorial
_PERCENT = re.compile(r"\s*\\?%$")
_INTEGER = re.compile(r"[-+]?\d+")



def too_costly(answer: str) -> bool:
    """True for answers math-verify must not see: too long, nested exponents, or
    exponents/factorials with integers over :data:`MAX_EXPONENT_DIGITS` digits."""
    return (len(answer) > MAX_ANSWER_CHARS or bool(_BIG_POWER.search(answer))
            or bool(_BIG_FACTORIAL.search(answer)) or bool(_NESTED_POWER.search(answer))
            or answer.count("^") + answer.count("**") > 4)


def without_thousands(text: str) -> str:
    """``text`` without its thousands separators when it is one number written with them
    (groups of exactly three digits, one kind of separator): ``"1,000"``, ``"1{,}000"``,
    ``"1\\,000"``, ``"1 000 000"`` -> ``"1000"``, ``"1000000"``; anything else unchanged
    (``"1,2"``, ``"1 0000"``, ``"3 3"``: not a number with thousands separators)."""
    return _SEPARATORS.sub("", text) if _THOUSANDS.fullmatch(text) else text


def canonical_answer(text: str) -> tuple[str, bool]:
    """The form both sides of a comparison take, and whether it carried a percent sign.

    Surrounding whitespace and trailing punctuation (``.,;:?``; not ``!``, a factorial) are removed, then a
    trailing ``%`` or ``\\%`` (noted), then thousands separators
    (:func:`without_thousands`).  ``"5\\%."`` -> ``("5", True)``; ``"1 000"`` ->
    ``("1000", False)``; ``"3."`` -> ``("3", False)``.
    """
    text = _TRAILING_PUNCTUATION.sub("", text.strip())
    percent = bool(_PERCENT.search(text))
    if percent:
        text = _PERCENT.sub("", text)
    return without_thousands(text.strip()), percent


def answers_match(answer: str, gold: str, *, timeout: float = CHECK_TIMEOUT_S) -> bool:
    """True when the boxed ``answer`` equals the one ``gold`` answer (steps 1-5 of the
    module docstring; math-verify at most ``timeout`` seconds).  False for too costly,
    unparseable or timed-out answers; never raises (but KeyboardInterrupt)."""
    (answer, answer_pct), (gold, gold_pct) = canonical_answer(answer), canonical_answer(gold)
    if answer_pct and not gold_pct:
        return False
    if answer == gold:
        return bool(answer)
    if not answer or too_costly(answer) or too_costly(gold):
        return False
    if _INTEGER.fullmatch(answer) and _INTEGER.fullmatch(gold):
        return int(answer) == int(gold)        # the common case, at once (025 is 25)
    answer, gold = without_e_notation(answer), without_e_notation(gold)
    verdict = compare_literals(answer, gold)
    if verdict is not None:
        return verdict
    if not same_letters(answer, gold) or too_costly(answer) or too_costly(gold):
        return False
    try:
        return verify_bounded(gold, answer, float(timeout))
    except CheckTimeout:
        return False


def check(completion_text: str, gold: "str | Gold", *, timeout: float = CHECK_TIMEOUT_S,
          answer_format: str = "boxed") -> bool:
    """Is the completion's final answer (by default the last ``\\boxed{}`` of its graded text) a gold answer?

    Args:
        completion_text: the decoded completion.
        gold: the reference answer, without ``\\boxed{}`` (e.g. ``"363"``, ``"\\frac{1}{2}"``),
            or a :class:`~scalectl.rl.reward.gold.Gold` (several answers, think tags).
        timeout: seconds math-verify may take on each comparison (see :func:`answers_match`).
        answer_format: where the final answer is (``reward.format``,
            :func:`scalectl.rl.reward.formats.final_answer`): ``boxed``, ``gsm8k``, ``last_line``.

    Returns:
        False when the graded text has no final answer in that format (no closed
        ``\\boxed{}``, no ``####``, no line; with think tags, a thinking block not
        closed); else whether :func:`answers_match` holds for any gold answer.

    Raises:
        ValueError: an unknown ``answer_format``.
    """
    answers, think_tags = (gold.answers, gold.think_tags) if isinstance(gold, Gold) else ((gold,), False)
    text = graded_text(completion_text, think_tags)
    answer = None if text is None else final_answer(text, answer_format)
    return answer is not None and any(answers_match(answer, g, timeout=timeout) for g in answers)


def reward(completion_text: str, gold: "str | Gold", *, timeout: float = CHECK_TIMEOUT_S,
           answer_format: str = "boxed") -> float:
    """+1.0 if :func:`check` passes, else -1.0 (rewards in {-1, +1}, docs/recipe-axes.md)."""
    return 1.0 if check(completion_text, gold, timeout=timeout, answer_format=answer_format) else -1.0


def score(completion: str, gold: "str | Gold", fields: dict | None = None, *, answer_format: str = "boxed",
          timeout: float = CHECK_TIMEOUT_S) -> Score:
    """The built-in reward function (``reward.function = "scalectl.rl.reward.checker:score"``,
    the default): ``Score(+1.0, True)`` when :func:`check` passes, else ``Score(-1.0, False)``.

    It has the signature of every reward function (docs/rewards.md), so that a function of
    the user's can build on it (``score(completion, gold, fields).correct``); ``fields`` (the
    row's other columns) is not read.  A run calls it with the recipe's ``reward.format``
    and ``reward.timeout_s`` (:mod:`scalectl.rl.reward.scoring`).
    """
    ok = check(completion, gold, timeout=timeout, answer_format=answer_format)
    return Score(1.0 if ok else -1.0, ok)
