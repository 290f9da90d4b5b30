"""Numbers as answers write them: one literal in every common notation, a unit after it,
and the relative tolerance two numbers are compared with.

A *number literal* is a decimal (``44000000``, ``-0.0025``, ``.5``) optionally scaled by a
power of ten in any of the notations answers use, or a bare power of ten:

==================================  ==========================
e-notation                          ``4.4e7``, ``4.4E+07``, ``1.6e-19``
``\\times``, ``\\cdot``, ``*``, ``×``, ``·``   ``4.4 \\times 10^{7}``, ``4.4\\times10^7``, ``4.4 \\cdot 10^{7}``
a bare power of ten                 ``10^{-3}``, ``10^7``
siunitx                             ``\\num{4.4e7}``
==================================  ==========================

(spaces and TeX spacing ``\\,`` ``\\;`` ``\\!`` ``\\ `` ``~`` allowed around the operator, a
Unicode minus ``−`` for ``-``; exponents of at most
:data:`MAX_EXPONENT_DIGITS` digits).  :func:`literal_value` reads one exactly, as a
:class:`~fractions.Fraction`; :func:`with_unit` splits a literal from a unit marked as text
(``5\\,\\text{m}``, ``4.4e7\\mathrm{~m/s}``, ``336^\\circ``, ``\\SI{5}{m}``).

math-verify reads ``4.4e7`` as 4.4 x e x 7 (Euler's number), so e-notation inside a larger
answer is rewritten for it as ``4.4\\times 10^{7}`` (:func:`without_e_notation`).

**Tolerance.** Two numbers are equal when they differ by at most :data:`REL_TOL` of the
larger magnitude (:func:`close`): relative at every magnitude, so ``1e-19`` and ``2e-19``
differ as much as 1 and 2 (math-verify rounds floats to 6 decimal places: an absolute
tolerance that makes every number below 5e-7 equal to every other).  Literals are read
exactly, so the tolerance only absorbs the rounding of evaluated expressions (sympy
evaluates to 30 digits; ``\\sqrt{2}`` against ``1.4142135623731`` is a difference of 1e-14),
far above double-precision rounding (2.2e-16), and still tells apart any two answers that
differ in their first nine significant digits.  A gold written as an integer (``1234567890123``,
``025``) is a count, matched exactly (``1.23456789e12`` is not it; ``4.4e7`` is ``44000000``).
A decimal is not equal to the rational it rounds (``0.333333`` is not 1/3): an answer is
right when it has the gold's value, not when it is near it (the checker errs on rejection).
"""

from __future__ import annotations

import re
from fractions import Fraction

#: Largest relative difference |a - b| / max(|a|, |b|) of two numbers called equal.
REL_TOL = 1e-9
#: Longest exponent (digits) a literal may have (as the checker's guard).
MAX_EXPONENT_DIGITS = 4

_REL_TOL = Fraction(1, 10**9)
assert float(_REL_TOL) == REL_TOL
_SPACE = r"(?:\s|\\[,;:! ]|~)*"
_SIGN = r"[-+−]?"
_DECIMAL = r"(?:\d+(?:\.\d*)?|\.\d+)"
_EXP = r"[-+−]?\d{1,%d}" % MAX_EXPONENT_DIGITS
_TIMES = r"(?:\\times|\\cdot|\\ast|\*|×|·|⋅)"


def _power(braced: str, bare: str) -> str:
    """``10^{n}`` or ``10^n`` (one digit), the exponent in the named groups."""
    return rf"10{_SPACE}\^{_SPACE}(?:\{{{_SPACE}(?P<{braced}>{_EXP}){_SPACE}\}}|(?P<{bare}>[-+−]?\d))"


_LITERAL = re.compile(
    rf"{_SPACE}(?P<sign>{_SIGN}){_SPACE}(?:"
    rf"(?P<mant>{_DECIMAL})(?:[eE](?P<e>{_EXP})|{_SPACE}{_TIMES}{_SPACE}{_power('p', 'q')})?"
    rf"|{_power('r', 's')}){_SPACE}")
_E_NOTATION = re.compile(rf"(?<![\w.\\}}])(?P<mant>{_DECIMAL})[eE](?P<e>{_EXP})(?![\w.])")
_INTEGER = re.compile(r"[-+]?\d+")
_ARG = r"\{((?:[^{}]|\{[^{}]*\})*)\}"          # a brace group, one level of braces inside
_NUM = re.compile(rf"^\s*\\num\s*{_ARG}\s*$")
_SI = re.compile(rf"^\s*\\(?:SI|qty)\s*{_ARG}\s*{_ARG}\s*$")
#: a unit marked as such: text groups, degrees, ohms and micro, joined by / \cdot, powers
_TEXT_GROUP = r"\\(?:text|textrm|mathrm|mbox|operatorname|rm)\s*\{[^{}]*\}"
_UNIT_PIECE = (rf"(?:{_TEXT_GROUP}|\^{_SPACE}\{{?{_SPACE}\\circ{_SPACE}\}}?|°|\\Omega|\\mu|\\AA"
               rf"|[/]|\\cdot|\^{_SPACE}\{{?{_SPACE}[-+−]?\d{{1,2}}{_SPACE}\}}?|[A-Za-z]|\s|\\[,;:! ]|~)")
_MARK = re.compile(rf"{_TEXT_GROUP}|\\circ|°|\\Omega|\\mu|\\AA")
_UNIT_TAIL = re.compile(rf"(?:{_UNIT_PIECE})+")
_UNWRAP = re.compile(r"\\(?:text|textrm|mathrm|mbox|operatorname|rm)\s*\{([^{}]*)\}")
_UNIT_NOISE = re.compile(r"\s|\\[,;:! ]|~|[{}]")


def _exponent(text: str) -> int:
    return int(text.replace("−", "-").replace(" ", ""))


def literal_value(text: str) -> Fraction | None:
    """The exact value of ``text`` when it is one number literal (see the module
    docstring), else None: ``"4.4e7"``, ``"4.4 \\times 10^{7}"`` and ``"44000000"`` ->
    ``Fraction(44000000)``; ``"10^{-3}"`` -> ``Fraction(1, 1000)``; ``"2x"``,
    ``"\\frac{1}{2}"``, ``"1e99999"`` -> None."""
    num = _NUM.match(text)
    if num:
        text = num.group(1)
    m = _LITERAL.fullmatch(text)
    if m is None:
        return None
    if m["mant"] is not None:
        value = Fraction(m["mant"])
        power = m["e"] or m["p"] or m["q"]
        if power is not None:
            value *= Fraction(10) ** _exponent(power)
    else:
        value = Fraction(10) ** _exponent(m["r"] or m["s"])
    return -value if m["sign"] in ("-", "−") else value


def unit_form(unit: str) -> str:
    """A unit as written, without its markup: text wrappers, spacing and braces go, degree
    marks become ``°`` (``"\\,\\mathrm{~m/s}"`` -> ``"m/s"``, ``"^{\\circ}"`` -> ``"°"``);
    letters and their case stay."""
    unit = re.sub(rf"\^{_SPACE}\{{?{_SPACE}\\circ{_SPACE}\}}?", "°", unit)
    while True:
        unwrapped = _UNWRAP.sub(r"\1", unit)
        if unwrapped == unit:
            break
        unit = unwrapped
    return _UNIT_NOISE.sub("", unit)


def with_unit(text: str) -> tuple[Fraction, str, bool] | None:
    """(value, unit, marked) when ``text`` is a number literal followed by a unit, else None.

    ``marked``: the unit is marked as one (a ``\\text{}``-like group, a degree sign,
    ``\\Omega``, ``\\mu``, or ``\\SI{}{}``): ``"4.4e7\\,\\mathrm{~m/s}"`` ->
    ``(Fraction(44000000), "m/s", True)``, ``"336^\\circ"`` -> ``(Fraction(336), "°", True)``.
    Unmarked, a tail of letters may be a unit or a symbol: ``"5 mm"`` -> ``(5, "mm", False)``,
    ``"3x"`` -> ``(3, "x", False)``.  ``"3\\sqrt{2}"``, ``"2\\pi"``, ``"3"`` -> None.  The
    unit is :func:`unit_form`.
    """
    si = _SI.match(text)
    if si:
        value = literal_value(si.group(1))
        return None if value is None else (value, unit_form(si.group(2)), True)
    m = _LITERAL.match(text)                   # the longest literal at the start
    if m is None:
        return None
    tail = text[m.end():]
    unit = unit_form(tail)
    if not (tail and _UNIT_TAIL.fullmatch(tail) and re.search("[A-Za-z°]", unit)):
        return None
    value = literal_value(text[:m.end()])
    return None if value is None else (value, unit, bool(_MARK.search(tail)))


#: Units that are a multiplier, not a unit: an answer may not add one the gold does not name.
SCALE_WORDS = frozenset("thousand thousands million millions billion billions trillion trillions hundred "
                        "hundreds dozen dozens lakh lakhs crore crores percent per cent ppm ppb ppt bn mn".split())
#: Single letters that, alone as a unit, are a multiplier: kilo, million (or mega), billion.
#: (``K``, ``T``, ``G`` are kelvin, tesla, gauss.)
SCALE_LETTERS = frozenset("kMB")
#: Where a marked unit starts: a text group, a degree sign, ohm, micro, angstrom.
_UNIT_START = re.compile(rf"(?:{_SPACE})(?:{_TEXT_GROUP}|\^{_SPACE}\{{?{_SPACE}\\circ|°|\\Omega|\\mu|\\AA)")
_OPEN_END = re.compile(r"[-+*/=^_{(\[,]$|\\(?:times|cdot|frac|sqrt)$")


def trailing_unit(text: str) -> tuple[str, str] | None:
    """(head, unit) when ``text`` ends in a unit marked as one (a ``\\text{}``-like group,
    a degree sign, ``\\Omega``, ``\\mu``, ``\\AA``, with powers, ``/``, ``\\cdot`` and
    letters after it) after a non-empty expression, else None.  The unit is
    :func:`unit_form`; the head is stripped.  ``"9.6 \\text{ nm}"`` -> ``("9.6", "nm")``;
    ``"3\\sqrt{2}\\,\\mathrm{m/s}^2"`` -> ``("3\\sqrt{2}", "m/s^2")``; ``"30^\\circ"`` ->
    ``("30", "°")``; ``"\\text{Paris}"``, ``"x \\text{ for } x > 0"``, ``"2x"`` -> None."""
    for m in _UNIT_START.finditer(text):
        head, tail = text[:m.start()].strip(), text[m.start():]
        if not head or _OPEN_END.search(head) or head.count("{") != head.count("}"):
            continue
        if _UNIT_TAIL.fullmatch(tail) and (unit := unit_form(tail)):
            return head, unit
        return None
    return None


def is_scale(unit: str) -> bool:
    """Whether ``unit`` (as :func:`unit_form` gives it) changes a number's value the way a
    multiplier does: a single ``k``, ``M``, ``B`` (:data:`SCALE_LETTERS`), or a word such as
    thousand, million, percent, ppm (:data:`SCALE_WORDS`) in it."""
    if unit in SCALE_LETTERS:
        return True
    lowered = unit.lower()
    return any(word in lowered for word in SCALE_WORDS if len(word) > 2) or lowered in SCALE_WORDS


def without_e_notation(text: str) -> str:
    """``text`` with every e-notation number written as ``\\times 10^{}`` (what math-verify
    reads): ``"(1.6e-19, 2)"`` -> ``"(1.6\\times 10^{-19}, 2)"``.  A number glued to a
    letter or a dot (``x2e3``, ``2e3.5``) and ``e`` without digits (``2e``) stay."""
    return _E_NOTATION.sub(lambda m: f"{m['mant']}\\times 10^{{{_exponent(m['e'])}}}", text)


def close(a, b) -> bool:
    """|a - b| <= :data:`REL_TOL` x max(|a|, |b|): exact for :class:`~fractions.Fraction`
    and int, in floating point for float and complex; 0 equals only 0."""
    if isinstance(a, (int, Fraction)) and isinstance(b, (int, Fraction)):
        return abs(Fraction(a) - Fraction(b)) <= _REL_TOL * max(abs(Fraction(a)), abs(Fraction(b)))
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b))


def compare_literals(answer: str, gold: str) -> bool | None:
    """The verdict on two answers that are numbers, with or without a unit, or None when
    one of them is something else (math-verify's to judge).

    * two literals: :func:`close`, but exactly against a gold written as an integer;
    * two numbers with units (:func:`with_unit`): equal values and the same unit as
      written (``5\\,\\text{m}`` is not ``5\\,\\text{mm}``, ``1\\,\\text{kJ}`` is not
      ``1000\\,\\text{J}``: units are not converted); two unmarked tails of letters
      are the same when they have the same letters (``3xy`` and ``3yx``), else math-verify
      judges (``3x`` and ``3 \\cdot x``);
    * the gold with a marked unit, the answer a bare literal: the values (the answer may
      leave out the unit the question fixes);
    * the answer with a unit the gold does not have: False (``18 dollars`` for 18, ``3x``
      for 3, ``0.5\\,\\text{m}`` for ``\\frac{1}{2}``).
    """
    a, g = literal_value(answer), literal_value(gold)
    if a is not None and g is not None:
        if _INTEGER.fullmatch(gold.strip()):
            return a == g                      # a count is exact: 1.23456789e12 is not 1234567890123
        return close(a, g)
    a_unit, g_unit = with_unit(answer), with_unit(gold)
    if a_unit is not None and g_unit is not None:
        if not close(a_unit[0], g_unit[0]):
            return False
        if a_unit[1] == g_unit[1]:
            return True
        if a_unit[2] or g_unit[2]:
            return False
        if a_unit[1].isalpha() and g_unit[1].isalpha():
            return sorted(a_unit[1]) == sorted(g_unit[1])
        return None
    if g_unit is not None and g_unit[2] and a is not None:
        return close(a, g_unit[0])
    if a_unit is not None and g_unit is None and (a_unit[2] or g is not None):
        return False
    return None
