"""The answer checker and the reward: +1 for a correct final answer, -1 otherwise.

The final answer is the content of the LAST ``\\boxed{...}`` of the completion
(braces balanced).  It is correct when it equals the gold answer as a string
(the fast path, ~1 us) or when math-verify says so: ``verify(parse(gold), parse(answer))``
(Hugging Face math-verify, the checker of record for every non-identical string).

Bounded time, safe in threads: math-verify's own timeouts use ``signal.alarm``
(main thread only), so they are turned off (``parsing_timeout=None``,
``timeout_seconds=None``) and time is bounded here instead: an answer longer than
:data:`MAX_ANSWER_CHARS`, with a nested exponent (``10^{10^{10}}`` does not return)
or with an integer of more than :data:`MAX_EXPONENT_DIGITS` digits in an exponent or
a factorial (``2^{100000000}``: > 1 s) scores False without being parsed.  Any
exception inside math-verify scores False.  Never raises on a completion.
"""

from __future__ import annotations

import functools
import logging
import re

#: Longest boxed answer (characters) that is parsed at all.
MAX_ANSWER_CHARS = 100
#: Longest integer (digits) allowed in an exponent or before a factorial.
MAX_EXPONENT_DIGITS = 4

_BOXED = "\\boxed{"
_BIG_POWER = re.compile(r"(\^|\*\*)\s*\{?\s*[-+]?\d{%d,}" % (MAX_EXPONENT_DIGITS + 1))
_BIG_FACTORIAL = re.compile(r"\d{%d,}\s*!" % (MAX_EXPONENT_DIGITS + 1))
_NESTED_POWER = re.compile(r"(\^|\*\*)\s*\{[^{}]*(\^|\*\*)")

logging.getLogger("math_verify").setLevel(logging.ERROR)  # the "timeout is disabled" warnings


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (nested braces balanced),
    or None when there is none or it is not closed: ``"a \\boxed{1} \\boxed{\\frac{1}{2}}"``
    -> ``"\\frac{1}{2}"``."""
    start = text.rfind(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start + len(_BOXED):i]
            i += 1
        start = text.rfind(_BOXED, 0, start)  # unclosed: an earlier, closed one may exist
    return None


def too_costly(answer: str) -> bool:
    """True for answers math-verify must not see: too long, nested exponents, or
    exponents/factorials with integers over :data:`MAX_EXPONENT_DIGITS` digits."""
    return (len(answer) > MAX_ANSWER_CHARS or bool(_BIG_POWER.search(answer))
            or bool(_BIG_FACTORIAL.search(answer)) or bool(_NESTED_POWER.search(answer))
            or answer.count("^") + answer.count("**") > 4)


@functools.lru_cache(maxsize=8192)
def _parse(expr: str):
    from math_verify import parse

    return parse(_BOXED + expr + "}", parsing_timeout=None)


def answers_match(answer: str, gold: str) -> bool:
    """True when the boxed ``answer`` equals ``gold``: the same string (after stripping
    surrounding whitespace), else by math-verify (``verify(parse(gold), parse(answer))``).  False for too costly or
    unparseable answers; never raises."""
    if answer.strip() == gold.strip():
        return True
    if not answer.strip() or too_costly(answer) or too_costly(gold):
        return False
    try:
        from math_verify import verify

        gold_p, answer_p = _parse(gold), _parse(answer)
        if not gold_p or not answer_p:
            return False
        return bool(verify(gold_p, answer_p, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - a malformed answer scores False, whatever math-verify raises
        return False


def check(completion_text: str, gold: str) -> bool:
    """Is the completion's final answer (last ``\\boxed{}``) equal to ``gold``?

    Args:
        completion_text: the decoded completion.
        gold: the reference answer, without ``\\boxed{}`` (e.g. ``"363"``, ``"\\frac{1}{2}"``).

    Returns:
        False when there is no closed ``\\boxed{}``; see :func:`answers_match` otherwise.
    """
    answer = last_boxed(completion_text)
    return answer is not None and answers_match(answer, gold)


def reward(completion_text: str, gold: str) -> float:
    """+1.0 if :func:`check` passes, else -1.0 (rewards in {-1, +1}, recipe-axes.md)."""
    return 1.0 if check(completion_text, gold) else -1.0
