"""The letters of an answer as written: what case and units math-verify does not compare.

math-verify lowercases what it parses (``X`` and ``x``, ``\\text{Paris}`` and
``\\text{paris}`` are one symbol to it) and drops units (``5\\,\\text{m}`` and
``5\\,\\text{km}`` both parse to 5).  :func:`letter_tokens` gives what an answer names, as
written, so that the checker can require two answers that both name something to name
the same things:

* a word inside a text group (``\\text{}``, ``\\mathrm{}``, ``\\operatorname{}``, ...) is
  one token (``\\text{km}`` -> ``km``, ``\\text{Paris}`` -> ``Paris``);
* a letter in math is a token of its own (``x^2+2xy`` and ``x(x+2y)`` -> ``x``, ``y``:
  juxtaposed letters are a product of variables, the TeX convention), so ``Kg`` is not
  ``kg``; a number followed by letters (``5 mm``, ``3xy``) is compared whole by
  :func:`scalectl.rl.reward.numbers.compare_literals` first, so ``5 mm`` is not ``5 m``;
* a Greek letter or a symbol command is a token of its own (``\\Omega`` is not
  ``\\omega``); other commands (``\\frac``, ``\\sqrt``, ``\\cdot``, ``\\pi``, ...) and
  function names (``sin``, ``log``, ...) are structure, not tokens;
* a leading assignment ``x =``, ``x_1 =``, ``\\theta_a =`` or ``f(x) =`` (math-verify compares its
  right-hand side) and e-notation
  (``4.4e7``, rewritten beforehand by :func:`scalectl.rl.reward.numbers.without_e_notation`)
  name nothing.

Case is kept everywhere: ``x`` and ``X`` are different variables, ``mA`` and ``MA``
different units.

**Primes.** math-verify drops primes (``x' + y = 0`` parses as ``x + y = 0``, ``f'(x)`` as
``f(x)``), so the primed names of two answers must be the same, with the same number of
primes (:func:`primed_names`): ``y''`` is not ``y'``, ``f'(x)`` is not ``f(x)``.
"""

from __future__ import annotations

import re

_TEXT = re.compile(r"\\(?:text|textrm|textit|textbf|textsf|mathrm|mathit|mathbf|mathsf|mathcal|mathbb"
                   r"|operatorname|mbox|rm)\s*\{([^{}]*)\}")
_COMMAND = re.compile(r"\\([A-Za-z]+)")
_WORD = re.compile(r"[A-Za-z]+")
_ASSIGNMENT = re.compile(r"^\s*(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?\w+\}?)?(?:\([^()=]*\))?\s*=(?!=)")
_GREEK = frozenset(
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi "
    "rho varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma "
    "Upsilon Phi Psi Omega hbar ell AA".split())
#: function names written without a backslash: structure, as ``\\sin`` is
_FUNCTIONS = frozenset("sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln lg exp "
                       "sqrt max min gcd lcm mod det".split())


_PRIME_MARK = re.compile(r"\^\s*\{\s*((?:\\prime\s*)+)\}|\^\s*\\prime|\\prime|'")
_PRIMED = re.compile(r"(\\[A-Za-z]+|[A-Za-z])\s*((?:_\{[^{}]*\}|_\w)?)\s*('+)")


def primed_names(answer: str) -> tuple[str, ...]:
    """The primed names of ``answer`` with their primes, sorted: ``"x' + y''"`` ->
    ``("x'", "y''")``; ``"y^{\\prime\\prime}"`` and ``"y''"`` -> ``("y''",)``;
    ``"f'(x) = 1"`` -> ``("f'",)``; ``"x_0'"`` and ``"x'_0"`` -> ``("x'",)``."""
    marks = _PRIME_MARK.sub(lambda m: "'" * max(1, m.group(1).count("\\prime") if m.group(1) else 1), answer)
    return tuple(sorted(m.group(1) + m.group(3) for m in _PRIMED.finditer(marks)))


def letter_tokens(answer: str) -> frozenset[str]:
    """The names ``answer`` writes (see the module docstring), as a set of strings:
    ``"5\\,\\text{km}"`` -> ``{"km"}``; ``"x^2 + 2xy"`` -> ``{"x", "y"}``;
    ``"\\frac{\\sqrt{3}}{2}"`` -> ``{}``; ``"y = 3X"`` -> ``{"X"}``."""
    text = _ASSIGNMENT.sub("", answer)
    tokens: set[str] = set()
    for group in _TEXT.findall(text):
        tokens.update(w for w in _WORD.findall(group) if w.lower() not in _FUNCTIONS)
    text = _TEXT.sub(" ", text)
    for name in _COMMAND.findall(text):
        if name in _GREEK:
            tokens.add("\\" + name)
    text = _COMMAND.sub(" ", text)
    tokens.update(c for w in _WORD.findall(text) if w not in _FUNCTIONS for c in w)
    return frozenset(tokens)


def same_letters(answer: str, gold: str) -> bool:
    """False when the primed names differ (:func:`primed_names`), or when both name something
    (:func:`letter_tokens`) and not the same things; True otherwise (a side without letters, e.g. a bare number, leaves the comparison to
    math-verify)."""
    if primed_names(answer) != primed_names(gold):
        return False
    a, g = letter_tokens(answer), letter_tokens(gold)
    return not (a and g) or a == g
