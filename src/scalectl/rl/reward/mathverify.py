"""math-verify in this process, with its numbers held to a relative tolerance.

``verify(parse(gold), parse(answer))`` (Hugging Face math-verify, its own ``signal.alarm``
timeouts off: the caller bounds the time, :mod:`scalectl.rl.reward.workers`).  math-verify
rounds floats to 6 decimal places before comparing them and chops small differences when it
evaluates, an absolute tolerance: ``1e-19`` equals ``2e-19`` to it.  So when it calls two
answers equal and both are numbers (or tuples, sets or intervals of numbers, nested), their
values must also agree within :data:`scalectl.rl.reward.numbers.REL_TOL` of the larger
magnitude, evaluated by sympy to 30 significant digits (:func:`numbers_agree`).  The
tolerance only takes away; it never makes math-verify's "unequal" equal.

**Partial parses.** math-verify falls back to what it could read: the first fraction of
``\\frac{1}{3}E_{1}+\\frac{2}{3}E_{2}`` (2/3), a prefix string of
``\\lambda_{\\text{red}}/\\sqrt{2}`` (``\\lambda_{``), ``1`` for ``-(x=1)``; two answers
that differ after that point would be equal.  A side whose parse is such a fallback
(:func:`partial_parse`) is not compared: the verdict is False with the reason as its
``error``, counted in the run's metrics like every other internal error.

**Derivatives.** ``\\frac{dx}{dt}`` parses as sympy's ``Derivative(x, t)`` of a symbol x,
which sympy evaluates to 0; it is compared as an unknown of its own instead
(:func:`opaque_derivatives`), so that ``\\frac{dx}{dt} = 2(kx - a)`` is not
``\\frac{dx}{dt} = kx - a``.
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple

from scalectl.rl.reward.numbers import REL_TOL
from scalectl.rl.reward.written import letter_tokens

#: Significant digits sympy evaluates both sides to before the relative comparison.
EVAL_DIGITS = 30
#: Letters that may stand for constants (Euler's number, the imaginary unit) in a parse
#: without free symbols.
_CONSTANT_LETTERS = frozenset("ei")

logging.getLogger("math_verify").setLevel(logging.ERROR)  # the "timeout is disabled" warnings


class Verdict(NamedTuple):
    """The outcome of one comparison.

    Attributes:
        correct: the answer equals the gold.
        error: None, or why the checker could not judge (an exception inside math-verify
            or sympy, a partial parse, a timeout): the answer then counts as wrong and the
            run's metrics count it (``checker_errors``).
    """

    correct: bool
    error: str | None = None


@functools.lru_cache(maxsize=8192)
def _parse(expr: str):
    from math_verify import parse

    return parse("\\boxed{" + expr + "}", parsing_timeout=None)


def _value(expr):
    """An assignment ``x = v`` compares by ``v`` (as math-verify does); anything else as is."""
    from sympy import Eq, Symbol

    return expr.rhs if isinstance(expr, Eq) and isinstance(expr.lhs, Symbol) else expr


def _evaluated(expr):
    """``expr`` with math-verify's unevaluated parts (``62.5\\%`` is ``62.5 * (1/100)``,
    the ``1/100`` held unevaluated) evaluated."""
    from sympy import UnevaluatedExpr

    return expr.replace(lambda e: isinstance(e, UnevaluatedExpr), lambda e: e.args[0])


def _scalar_agree(a, b) -> bool | None:
    from sympy import Expr, N

    if not (isinstance(a, Expr) and isinstance(b, Expr) and a.is_number and b.is_number):
        return None
    a, b = N(_evaluated(a), EVAL_DIGITS), N(_evaluated(b), EVAL_DIGITS)
    try:
        a, b = complex(a), complex(b)
    except (TypeError, ValueError):
        return None
    diff, size = abs(a - b), max(abs(a), abs(b))
    if diff != diff or size != size or size == float("inf"):
        return None
    return diff <= REL_TOL * size


def _elements(expr):
    """The elements of a tuple, a finite set or an interval (its ends), or None."""
    from sympy import FiniteSet, Interval, Tuple

    if isinstance(expr, Tuple):
        return ("tuple", list(expr))
    if isinstance(expr, FiniteSet):
        return ("set", list(expr))
    if isinstance(expr, Interval):
        return ("interval", [expr.start, expr.end])
    return None


def numbers_agree(gold, answer) -> bool | None:
    """Whether two parsed answers agree within the relative tolerance, or None when they
    are not numbers: scalars (after an assignment's right-hand side), tuples of one length
    element by element, intervals by their ends, finite sets as multisets (each gold element
    matched to an answer element that agrees with it), any of these nested (a set of tuples);
    two equations side by side (``\\cos(\\pi) = -1`` is not ``\\cos(\\pi) = -2``, which
    math-verify, evaluating both to False, calls equal).  Infinite or non-real-or-complex
    values give None; so do containers of other kinds."""
    from sympy import Eq

    gold, answer = _value(gold), _value(answer)
    if isinstance(gold, Eq) and isinstance(answer, Eq):
        # math-verify calls "2 = -1" and "2 = -2" equal (two false statements); sides of numbers decide
        sides = [numbers_agree(gold.lhs, answer.lhs), numbers_agree(gold.rhs, answer.rhs)]
        if None in sides:
            return None
        return all(sides)
    g, a = _elements(gold), _elements(answer)
    if g is None and a is None:
        return _scalar_agree(gold, answer)
    if g is None or a is None or g[0] != a[0] or len(g[1]) != len(a[1]):
        return None
    kind, gs, as_ = g[0], g[1], a[1]
    if kind != "set":
        verdicts = [numbers_agree(x, y) for x, y in zip(gs, as_)]
        return None if None in verdicts else all(verdicts)
    unused = list(as_)
    for x in gs:
        for i, y in enumerate(unused):
            verdict = numbers_agree(x, y)
            if verdict is None:
                return None
            if verdict:
                del unused[i]
                break
        else:
            return False
    return True


def _text(parsed) -> str:
    return parsed[-1] if isinstance(parsed[-1], str) else ""


def opaque_derivatives(expr):
    """``expr`` with every derivative of an expression in letters other than its variables
    (``\\frac{dx}{dt}``, ``\\frac{\\partial u}{\\partial t}``: ``Derivative(x, t)``) as a
    symbol of its own, named by the derivative.

    sympy takes x for a constant in t and evaluates that derivative to 0, so math-verify
    read ``\\frac{dx}{dt} = kx - a`` as ``0 = kx - a`` and any multiple of the right-hand side
    solved alike (``= 2(kx - a)`` was the gold).  As a symbol, the derivative is an unknown
    like any other: ``= -a + kx`` is the gold, ``= 2(kx - a)`` is not.  A derivative sympy can
    take (``\\frac{d}{dx} x^2``, nothing but its variable in it) is left as it is."""
    from sympy import Basic, Derivative, Symbol

    if not isinstance(expr, Basic):
        return expr

    def unknown(d) -> bool:
        return isinstance(d, Derivative) and bool(d.expr.free_symbols - set(d.variables))

    return expr.replace(unknown, lambda d: Symbol(str(d)))


def partial_parse(text: str, parsed) -> str | None:
    """Why math-verify's ``parsed`` (its ``parse`` of ``text``) is a fallback that dropped part
    of ``text``, or None when it is a reading of the whole: nothing parsed; only a string,
    and not the whole text; or a value without free symbols or functions (``I(0)``) while
    ``text`` names letters other than ``e`` and ``i`` (the constants a parse may read them as)."""
    from sympy import Basic
    from sympy.core.function import AppliedUndef

    if not parsed:
        return f"math-verify could not parse {text!r}"
    first = parsed[0]
    if isinstance(first, str):
        if "".join(first.split()) != "".join(text.split()):
            return f"math-verify read only {first!r} of {text!r}"
        return None
    if isinstance(first, Basic) and not first.free_symbols and not first.atoms(AppliedUndef):
        letters = {t for t in letter_tokens(text) if t not in _CONSTANT_LETTERS}
        if letters:
            return f"math-verify read {text!r} as {first} (without {', '.join(sorted(letters))})"
    return None


def verify_here(gold: str, answer: str) -> Verdict:
    """math-verify on two answer strings (without ``\\boxed{}``), in this process and
    unbounded in time, their derivatives of unknown functions as symbols
    (:func:`opaque_derivatives`), then :func:`numbers_agree` on their first parses when it says
    equal.  A partial parse of either side, or any exception inside math-verify or sympy,
    gives ``Verdict(False, reason)``; never raises (but KeyboardInterrupt)."""
    try:
        from math_verify import verify

        gold_p, answer_p = ([opaque_derivatives(e) for e in _parse(text)] for text in (gold, answer))
        for text, parsed in ((gold, gold_p), (answer, answer_p)):
            reason = partial_parse(text, parsed)
            if reason:
                return Verdict(False, reason)
        if not verify(gold_p, answer_p, timeout_seconds=None):
            return Verdict(False)
        return Verdict(numbers_agree(gold_p[0], answer_p[0]) is not False)
    except Exception as exc:  # noqa: BLE001 - whatever math-verify or sympy raise is reported, not raised
        return Verdict(False, f"{type(exc).__name__} comparing {answer!r} with {gold!r}: {exc}")
