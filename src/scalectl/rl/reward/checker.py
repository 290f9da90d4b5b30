"""The answer checker and the reward: +1 for a correct final answer, -1 otherwise.

The final answer is the content of the LAST ``\\boxed{...}`` of the graded text (braces
balanced): the whole completion, or with think tags only what follows the last
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

from scalectl.rl.reward.gold import Gold, graded_text
from scalectl.rl.reward.numbers import MAX_EXPONENT_DIGITS, compare_literals, without_e_notation
from scalectl.rl.reward.workers import CheckTimeout, verify_bounded
from scalectl.rl.reward.written import same_letters

#: Longest boxed answer (characters) that is parsed at all.
MAX_ANSWER_CHARS = 100
#: Seconds one math-verify comparison (parse + verify, in a worker process) may take.
CHECK_TIMEOUT_S = 5.0

_BOXED = "\\boxed{"
_BIG_POWER = re.compile(r"(\^|\*\*)\s*\{?\s*[-+]?\d{%d,}" % (MAX_EXPONENT_DIGITS + 1))
_BIG_FACTORIAL = re.compile(r"\d{%d,}\s*!" % (MAX_EXPONENT_DIGITS + 1))
_NESTED_POWER = re.compile(r"(\^|\*\*)\s*\{[^{}]*(\^|\*\*)")
#: one separator kind between groups of exactly three digits: , {,} \, \; \: \! \  ~ or a space
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?P<sep>,|\{,\}|\\[,;:! ]|~| )\d{3}(?:(?P=sep)\d{3})*(?:\.\d+)?")
_SEPARATORS = re.compile(r",|\{,\}|\\[,;:! ]|~| ")
_TRAILING_PUNCTUATION = re.compile(r"(?<=\S)\s*[.,;:?]+$")    # not "!": a factorial
_PERCENT = re.compile(r"\s*\\?%$")
_BOX_OR_BRACE = re.compile(r"\\boxed\{|[{}]")
_INTEGER = re.compile(r"[-+]?\d+")



def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (nested braces balanced),
    or None when there is none or it is not closed: ``"a \\boxed{1} \\boxed{\\frac{1}{2}}"``
    -> ``"\\frac{1}{2}"``.

    One pass over the braces (linear time: a megabyte of unclosed ``\\boxed{`` takes
    well under a second)."""
    if _BOXED not in text:
        return None
    stack: list[int] = []          # content start of an open box, or -1 for a plain brace
    best: tuple[int, int] | None = None
    for m in _BOX_OR_BRACE.finditer(text):
        if m.group() == "}":
            if stack:
                opened = stack.pop()
                if opened >= 0 and (best is None or opened > best[0]):
                    best = (opened, m.start())
        else:
            stack.append(m.end() if len(m.group()) > 1 else -1)
    return None if best is None else text[best[0]:best[1]]


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


def check(completion_text: str, gold: "str | Gold", *, timeout: float = CHECK_TIMEOUT_S) -> bool:
    """Is the completion's final answer (last ``\\boxed{}`` of its graded text) a gold answer?

    Args:
        completion_text: the decoded completion.
        gold: the reference answer, without ``\\boxed{}`` (e.g. ``"363"``, ``"\\frac{1}{2}"``),
            or a :class:`~scalectl.rl.reward.gold.Gold` (several answers, think tags).
        timeout: seconds math-verify may take on each comparison (see :func:`answers_match`).

    Returns:
        False when the graded text has no closed ``\\boxed{}`` (or, with think tags, the
        thinking block is not closed); else whether :func:`answers_match` holds for any
        gold answer.
    """
    answers, think_tags = (gold.answers, gold.think_tags) if isinstance(gold, Gold) else ((gold,), False)
    text = graded_text(completion_text, think_tags)
    answer = None if text is None else last_boxed(text)
    return answer is not None and any(answers_match(answer, g, timeout=timeout) for g in answers)


def reward(completion_text: str, gold: "str | Gold", *, timeout: float = CHECK_TIMEOUT_S) -> float:
    """+1.0 if :func:`check` passes, else -1.0 (rewards in {-1, +1}, docs/recipe-axes.md)."""
    return 1.0 if check(completion_text, gold, timeout=timeout) else -1.0
