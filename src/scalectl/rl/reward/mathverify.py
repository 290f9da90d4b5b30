"""math-verify in this process, with its numbers held to a relative tolerance.

``verify(parse(gold), parse(answer))`` (Hugging Face math-verify, its own ``signal.alarm``
timeouts off: the caller bounds the time, :mod:`scalectl.rl.reward.workers`).  math-verify
rounds floats to 6 decimal places before comparing them and chops small differences when it
evaluates, an absolute tolerance: ``1e-19`` equals ``2e-19`` to it.  So when it calls two
answers equal and both are numbers (or tuples, sets or intervals of numbers), their values
must also agree within :data:`scalectl.rl.reward.numbers.REL_TOL` of the larger magnitude,
evaluated by sympy to 30 significant digits (:func:`numbers_agree`).  The tolerance only
takes away; it never makes math-verify's "unequal" equal.
"""

from __future__ import annotations

import functools
import logging

from scalectl.rl.reward.numbers import REL_TOL

#: Significant digits sympy evaluates both sides to before the relative comparison.
EVAL_DIGITS = 30

logging.getLogger("math_verify").setLevel(logging.ERROR)  # the "timeout is disabled" warnings


@functools.lru_cache(maxsize=8192)
def _parse(expr: str):
    from math_verify import parse

    return parse("\\boxed{" + expr + "}", parsing_timeout=None)


def _value(expr):
    """An assignment ``x = v`` compares by ``v`` (as math-verify does); anything else as is."""
    from sympy import Eq, Symbol

    return expr.rhs if isinstance(expr, Eq) and isinstance(expr.lhs, Symbol) else expr


def _scalar_agree(a, b) -> bool | None:
    from sympy import Abs, Expr, Float, Max, N

    if not (isinstance(a, Expr) and isinstance(b, Expr) and a.is_number and b.is_number):
        return None
    diff, size = N(Abs(a - b), EVAL_DIGITS), N(Max(Abs(a), Abs(b)), EVAL_DIGITS)
    if not (diff.is_real and size.is_real and diff.is_finite and size.is_finite):
        return None
    return bool(diff <= Float(REL_TOL, EVAL_DIGITS) * size)


def numbers_agree(gold, answer) -> bool | None:
    """Whether two parsed answers agree within the relative tolerance, or None when they
    are not numbers: scalars (after an assignment's right-hand side), tuples of one length
    element by element, finite sets of real numbers in sorted order, intervals by their
    ends.  Infinite or non-real differences give None."""
    from sympy import FiniteSet, Interval, N, Tuple

    gold, answer = _value(gold), _value(answer)
    pairs = None
    if isinstance(gold, Tuple) and isinstance(answer, Tuple) and len(gold) == len(answer):
        pairs = list(zip(gold, answer))
    elif isinstance(gold, FiniteSet) and isinstance(answer, FiniteSet) and len(gold) == len(answer):
        try:
            pairs = list(zip(sorted(gold, key=lambda v: float(N(v))), sorted(answer, key=lambda v: float(N(v)))))
        except (TypeError, ValueError):
            return None
    elif isinstance(gold, Interval) and isinstance(answer, Interval):
        pairs = [(gold.start, answer.start), (gold.end, answer.end)]
    if pairs is None:
        return _scalar_agree(gold, answer)
    verdicts = [_scalar_agree(g, a) for g, a in pairs]
    return None if None in verdicts else all(verdicts)


def verify_here(gold: str, answer: str) -> bool:
    """math-verify on two answer strings (without ``\\boxed{}``), in this process and
    unbounded in time, then :func:`numbers_agree` on their first parses when it says
    equal.  False for unparseable input or any exception."""
    try:
        from math_verify import verify

        gold_p, answer_p = _parse(gold), _parse(answer)
        if not gold_p or not answer_p:
            return False
        if not verify(gold_p, answer_p, timeout_seconds=None):
            return False
        return numbers_agree(gold_p[0], answer_p[0]) is not False
    except Exception:  # noqa: BLE001 - a malformed answer scores False, whatever math-verify or sympy raise
        return False
