"""The answer checker and the reward: +1 for a correct final answer, -1 otherwise.

The final answer is the content of the LAST ``\\boxed{...}`` of the graded text (braces
balanced; or, with ``reward.format``, what follows the last ``####`` or the last line:
:mod:`scalectl.rl.reward.formats`): the whole completion, or with think tags only what follows the last
``</think>`` (:func:`scalectl.rl.reward.gold.graded_text`: an unfinished thinking block
has no answer).  The gold is a string or a :class:`~scalectl.rl.reward.gold.Gold` of
several acceptable answers; the completion is right when its answer equals any of them.

Two answers are compared (:func:`answers_match`) in steps, each of which may decide:

1. both are normalised alike (:func:`canonical_answer`): math delimiters around the answer
   (``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``) and ``$`` signs in it go, so do
   ``\\left``/``\\right`` (and ``\\big`` ...) before a delimiter and ``\\displaystyle``;
   ``\\dfrac`` and ``\\tfrac`` are ``\\frac``; TeX spacing (``\\,`` ``\\;`` ``\\quad``
   ``~`` ...) and spaces go outside text groups (kept: one after a command word, and between
   two digits); surrounding whitespace and trailing punctuation go (``3.`` is 3),
   thousands separators go when every group has three digits (``1,000``, ``1{,}000``,
   ``1\\,000``, ``1 000``), and a trailing percent sign is set apart.  A percent sign counts
   only where the gold has one: an answer with one against a gold without (``5\\%`` for 5,
   ``50\\%`` for 0.5) is wrong, and a gold with one is compared by its number (``5`` or
   ``5\\%`` for ``5\\%``, not ``0.05``).  The same string is equal.  A minus before a
   parenthesised tuple, interval or equation (``-((1, 2))``, ``-(x = 1)``: math-verify
   drops that minus) is wrong unless the gold has it.  A number times a tuple
   (``2\\left((\\frac{1}{4}, \\frac{1}{27})\\right)``, ``(1, 3) \\cdot 2``), whose factor
   math-verify drops, is the tuple of the products (:func:`scaled_groups`); a number beside
   an interval, a set or a tuple inside a longer answer is not compared (an error);
   **units** (:func:`~scalectl.rl.reward.numbers.trailing_unit`): a unit marked as one at
   the end of an answer (``9.6 \\text{ nm}``, ``30^\\circ``) that the gold does not name
   is ignored, unless it is a multiplier (``\\text{ thousand}``, ``\\text{k}``: wrong); a
   unit the gold names must be the same as written (``\\text{km}`` is not ``\\text{m}``),
   and an answer may leave it out;
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
   e-notation rewritten as ``\\times 10^{}`` for it, numbers it calls equal held to
   the same relative tolerance, and a derivative such as ``\\frac{dx}{dt}`` (which sympy
   evaluates to 0) compared as an unknown of its own (:mod:`scalectl.rl.reward.mathverify`).

A checker that accepts wrong answers is a reward-hacking surface, so what stays ambiguous
is rejected.  An exception inside math-verify or sympy, a partial parse and a timeout score
False and are reported (:func:`judge`'s ``error``; a run counts them, ``checker_errors``).
Never raises on a completion.
"""

from __future__ import annotations

import re
from fractions import Fraction

from scalectl.rl.reward.formats import final_answer, last_boxed  # noqa: F401 - last_boxed: a public name here
from scalectl.rl.reward.gold import Gold, graded_text
from scalectl.rl.reward.mathverify import Verdict
from scalectl.rl.reward.numbers import (MAX_EXPONENT_DIGITS, compare_literals, is_scale, trailing_unit,
                                        without_e_notation)
from scalectl.rl.reward.score import Score
from scalectl.rl.reward.workers import CheckTimeout, verify_bounded
from scalectl.rl.reward.written import same_letters

#: Longest boxed answer (characters) that is parsed at all.
MAX_ANSWER_CHARS = 100
#: Most powers (``^``, ``**``) an answer parsed at all may have (a checker process bounds the
#: time of the rest).
MAX_POWERS = 8
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
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_DOLLAR = re.compile(r"(?<!\\)\$")
_SIZED = re.compile(r"\\(?:left|right|[bB]igg?[lrm]?)(?![A-Za-z])\s*(\.)?")
_FRAC = re.compile(r"\\[dt]frac(?![A-Za-z])")
_DISPLAY = re.compile(r"\\(?:displaystyle|textstyle)(?![A-Za-z])")
_TEX_SPACE = re.compile(r"\\(?:[,;:! ]|q?quad(?![A-Za-z])|enspace(?![A-Za-z])|thinspace(?![A-Za-z]))|~")
_TEXTLIKE = re.compile(r"(\\(?:text|textrm|textit|textbf|mathrm|mathit|mathbf|operatorname|mbox|rm)\s*\{[^{}]*\})")
_WORD_SPACE = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z0-9])")
_DIGIT_SPACE = re.compile(r"(?<=\d)\s+(?=\d)")
_PRIME_POWER = re.compile(r"\^\s*\{\s*((?:\\prime\s*)+)\}|\^\s*\\prime(?![A-Za-z])")
_NEGATED_GROUP = re.compile(r"-\s*(\(|\[|\\\{)(.*)(\)|\]|\\\})")



#: a number as a factor: digits, a decimal, \frac{..}{..}, \sqrt{..}, \pi, one after another (``2\pi``)
_FACTOR = (r"(?:\d+(?:\.\d*)?|\.\d+|\\frac\{[^{}]*\}\{[^{}]*\}|\\sqrt(?:\[[^\]]*\])?\{[^{}]*\}"
           r"|\\pi(?![A-Za-z]))+")
_PRODUCT = r"(?:\\cdot|\\times|\\ast|\*|×|·)?"
_FACTOR_BEFORE = re.compile(rf"(?<![_^\\A-Za-z\d.])(?P<factor>{_FACTOR})\s*{_PRODUCT}\s*$")
_FACTOR_AFTER = re.compile(rf"^\s*{_PRODUCT}\s*(?P<factor>{_FACTOR})(?![A-Za-z])")
_OPENERS, _CLOSERS = ("\\{", "(", "["), ("\\}", ")", "]")
_SIMPLE_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


def _bracket_groups(text: str) -> list[tuple[int, int, int]]:
    """``(start, end, depth)`` of every bracketed group of ``text`` (``(..)``, ``[..]``,
    ``\\{..\\}``, mixed as an interval's ``[0, 1)``; ``end`` past its closer), at any depth;
    TeX braces count for the depth but make no group."""
    groups, stack, depth, i = [], [], 0, 0
    while i < len(text):
        token = next((t for t in _OPENERS + _CLOSERS + ("{", "}") if text.startswith(t, i)), text[i])
        if token in _OPENERS:
            stack.append((i, depth))
            depth += 1
        elif token in _CLOSERS and stack:
            start, d = stack.pop()
            depth = d
            groups.append((start, i + len(token), d))
        elif token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
        i += len(token)
    return sorted(groups)


def _top_level_items(text: str) -> list[str]:
    """``text`` split at its commas outside every bracket and brace."""
    items, depth, start, i = [], 0, 0, 0
    while i < len(text):
        token = next((t for t in _OPENERS + _CLOSERS if text.startswith(t, i)), text[i])
        if token in _OPENERS or token == "{":
            depth += 1
        elif token in _CLOSERS or token == "}":
            depth -= 1
        elif token == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        i += len(token)
    return items + [text[start:]]


def _inside(group: str) -> str:
    """The content of a bracketed ``group``, without parentheses that only wrap one more
    group (``((1, 2))`` -> ``1, 2``)."""
    opener = next(t for t in _OPENERS if group.startswith(t))
    closer = next(t for t in _CLOSERS if group.endswith(t))
    inner = group[len(opener):-len(closer)]
    while inner.startswith("(") and inner.endswith(")") and _bracket_groups(inner)[:1] == [(0, len(inner), 0)]:
        inner = inner[1:-1]
    return inner


_RATIONAL = re.compile(r"(?P<sign>[-+]?)(?:(?P<number>\d+(?:\.\d*)?|\.\d+)"
                       r"|\\frac\{(?P<num>[-+]?\d+)\}\{(?P<den>[-+]?\d+)\})")


def _rational(text: str) -> Fraction | None:
    """The value of an integer, a decimal or ``\\frac{p}{q}`` of integers (signed), else None."""
    m = _RATIONAL.fullmatch(text)
    if m is None or (m["den"] is not None and int(m["den"]) == 0):
        return None
    value = Fraction(m["number"]) if m["number"] is not None else Fraction(int(m["num"]), int(m["den"]))
    return -value if m["sign"] == "-" else value


def _written(value: Fraction) -> str:
    """A rational as an answer writes it: ``-3``, ``\\frac{1}{2}``, ``-\\frac{2}{27}``."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def scaled_groups(text: str) -> tuple[str, str | None]:
    """``text`` with a number times a tuple distributed over its elements, or why a factor
    beside a tuple, interval or set cannot be read.

    math-verify drops such a factor (``2\\left((\\frac{1}{4}, \\frac{1}{27})\\right)`` read as
    the set {1/4, 1/27}, ``3(\\frac{1}{4}, 2)`` as 2), which made a multiple of the gold
    equal to it.  An answer that is only a number times one tuple, the number before it or
    after it (``\\cdot``, ``\\times`` or nothing between), is rewritten as the tuple of
    products: exactly where all are integers, decimals or fractions of integers
    (``2(\\frac{1}{4}, 3)`` -> ``(\\frac{1}{2},6)``), else written out
    (``\\pi(1, x)`` -> ``(\\pi\\cdot1,\\pi\\cdot(x))``).  A number beside any other group with
    a comma (an interval ``[1, 3]``, a set, a tuple inside a longer answer, a tuple of tuples)
    gives the reason, and the answer is not compared.  A letter or a command before the group (``f(1, 2)``,
    ``\\max(1, 2)``) is no factor.

    Returns:
        (text, None): rewritten, or unchanged when no number touches such a group;
        (text, reason): a factor that cannot be read.
    """
    for start, end, _ in _bracket_groups(text):
        group = text[start:end]
        items = _top_level_items(_inside(group))
        if len(items) < 2:
            continue
        before, after = _FACTOR_BEFORE.search(text[:start]), _FACTOR_AFTER.search(text[end:])
        if before is None and after is None:
            continue
        factor = (before or after)["factor"]
        head = text[:before.start()] if before else text[:start]
        tail = text[end + after.end():] if after else text[end:]
        sign = head if head in ("", "-", "+") else None
        scalars = not any(len(_top_level_items(_inside(item[a:b]))) > 1
                          for item in items for a, b, _ in _bracket_groups(item))
        if sign is not None and not tail and (before is None) != (after is None) and group.startswith("(") \
                and group.endswith(")") and (after is None or not sign) and scalars:
            exact = [_rational(x) for x in (sign + factor, *items)]
            if None not in exact:           # numbers: the products, exactly (math-verify is slow on them)
                parts = [_written(exact[0] * x) for x in exact[1:]]
            else:
                parts = [f"{sign}{factor}\\cdot" + (item if _SIMPLE_NUMBER.fullmatch(item) else f"({item})")
                         for item in items]
            return "(" + ",".join(parts) + ")", None
        return text, (f"a factor beside a tuple, interval or set in {text!r} ({factor!r} and {group!r}): "
                      "math-verify drops it, so the answer is not compared")
    return text, None


def too_costly(answer: str) -> bool:
    """True for answers math-verify must not see: too long, nested exponents, or
    exponents/factorials with integers over :data:`MAX_EXPONENT_DIGITS` digits."""
    return (len(answer) > MAX_ANSWER_CHARS or bool(_BIG_POWER.search(answer))
            or bool(_BIG_FACTORIAL.search(answer)) or bool(_NESTED_POWER.search(answer))
            or answer.count("^") + answer.count("**") > MAX_POWERS)


def without_thousands(text: str) -> str:
    """``text`` without its thousands separators when it is one number written with them
    (groups of exactly three digits, one kind of separator): ``"1,000"``, ``"1{,}000"``,
    ``"1\\,000"``, ``"1 000 000"`` -> ``"1000"``, ``"1000000"``; anything else unchanged
    (``"1,2"``, ``"1 0000"``, ``"3 3"``: not a number with thousands separators)."""
    return _SEPARATORS.sub("", text) if _THOUSANDS.fullmatch(text) else text


def without_delimiters(text: str) -> str:
    """``text`` without math delimiters around it (``$...$``, ``$$...$$``, ``\\(...\\)``,
    ``\\[...\\]``, repeatedly) and without the ``$`` signs left in it (not ``\\$``):
    ``"$f(z)=z$"`` -> ``"f(z)=z"``; ``"$8 \\%$"`` -> ``"8 \\%"``; ``"x = $5$"`` -> ``"x = 5"``."""
    text = text.strip()
    stripped = True
    while stripped:
        stripped = False
        for left, right in _DELIMITERS:
            if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right):
                text, stripped = text[len(left):-len(right)].strip(), True
                break
    return _DOLLAR.sub("", text)


def without_spacing(text: str) -> str:
    """``text`` without the spacing that does not change a formula: TeX spacing commands and
    spaces, outside text groups (``\\text{ m}`` keeps its own); one space stays after a
    command word before a letter or digit (``\\pi t``) and between two digits (``1 000``,
    ``3 5``: a thousands separator or two numbers).  ``\\left``, ``\\right`` and
    ``\\big``-like sizes before a delimiter, ``\\displaystyle`` go, and ``\\dfrac``,
    ``\\tfrac`` are ``\\frac``, ``^{\\prime\\prime}`` is ``''``: ``"\\left( 1 ,\\, 2 \\right)"`` -> ``"(1,2)"``."""
    parts = _TEXTLIKE.split(text)
    for i in range(0, len(parts), 2):          # the even parts are outside text groups
        part = _SIZED.sub("", parts[i])
        part = _DISPLAY.sub(" ", _FRAC.sub(r"\\frac", part))
        part = _PRIME_POWER.sub(lambda m: "'" * (m.group(1).count("\\prime") if m.group(1) else 1), part)
        part = _TEX_SPACE.sub(" ", part)
        part = _WORD_SPACE.sub(lambda m: m.group(1) + "\x00", part)
        part = _DIGIT_SPACE.sub("\x00", part)
        parts[i] = re.sub(r"\s+", "", part).replace("\x00", " ")
    return "".join(parts).strip()


def negated_group(text: str) -> bool:
    """Whether ``text`` is a minus before one bracketed tuple, interval, set or equation
    (``-((1, 2))``, ``-(x=1)``, ``-[1, 2]``, ``-\\{1\\}``): a negation math-verify drops."""
    m = _NEGATED_GROUP.fullmatch(text.strip())
    if m is None:
        return False
    depth, inner = 0, m.group(2)
    for ch in inner:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0:
            return False                      # "-(1)+(2)": the group closes before the end
    return depth == 0 and (m.group(1) != "(" or "," in inner or "=" in inner)


def canonical_answer(text: str) -> tuple[str, bool]:
    """The form both sides of a comparison take, and whether it carried a percent sign.

    Math delimiters go (:func:`without_delimiters`), then spacing (:func:`without_spacing`),
    surrounding whitespace and trailing punctuation (``.,;:?``; not ``!``, a factorial), then
    a trailing ``%`` or ``\\%`` (noted), then thousands separators
    (:func:`without_thousands`).  ``"5\\%."`` -> ``("5", True)``; ``"1 000"`` ->
    ``("1000", False)``; ``"3."`` -> ``("3", False)``; ``"$8 \\%$"`` -> ``("8", True)``.
    """
    text = without_thousands(without_delimiters(text))
    text = _TRAILING_PUNCTUATION.sub("", without_spacing(text))
    percent = bool(_PERCENT.search(text))
    if percent:
        text = _PERCENT.sub("", text)
    return without_thousands(text.strip()), percent


def answers_match(answer: str, gold: str, *, timeout: float = CHECK_TIMEOUT_S) -> bool:
    """True when the boxed ``answer`` equals the one ``gold`` answer (:func:`judge`'s
    ``correct``).  Never raises (but KeyboardInterrupt)."""
    return judge(answer, gold, timeout=timeout).correct


def _units(answer: str, gold: str) -> tuple[str, str] | bool:
    """Both sides without their marked units, or the verdict the units give (False)."""
    a, g = trailing_unit(answer), trailing_unit(gold)
    if a is not None and g is not None:
        return (a[0], g[0]) if a[1] == g[1] else False
    if a is not None:
        return False if is_scale(a[1]) else (a[0], gold)
    if g is not None:
        return answer, g[0]
    return answer, gold


def judge(answer: str, gold: str, *, timeout: float = CHECK_TIMEOUT_S) -> Verdict:
    """The verdict on the boxed ``answer`` against the one ``gold`` answer (steps 1-5 of the
    module docstring; math-verify at most ``timeout`` seconds).

    Returns:
        ``Verdict(correct, error)``: ``error`` is None, or why the checker could not judge
        (an exception inside math-verify or sympy, a partial parse, a timeout), the answer
        then being wrong.  Too costly and empty answers are wrong without an error.
    Never raises (but KeyboardInterrupt).
    """
    (answer, answer_pct), (gold, gold_pct) = canonical_answer(answer), canonical_answer(gold)
    if answer_pct and not gold_pct:
        return Verdict(False)
    if answer == gold:
        return Verdict(bool(answer))
    if not answer or too_costly(answer) or too_costly(gold):
        return Verdict(False)
    if negated_group(answer) != negated_group(gold):
        return Verdict(False)
    sides = _units(answer, gold)
    if sides is False:
        return Verdict(False)
    answer, gold = sides
    if answer == gold:
        return Verdict(True)
    if _INTEGER.fullmatch(answer) and _INTEGER.fullmatch(gold):
        return Verdict(int(answer) == int(gold))        # the common case, at once (025 is 25)
    (answer, answer_factor), (gold, gold_factor) = scaled_groups(answer), scaled_groups(gold)
    if answer_factor or gold_factor:
        return Verdict(False, answer_factor or gold_factor)
    answer, gold = without_e_notation(answer), without_e_notation(gold)
    verdict = compare_literals(answer, gold)
    if verdict is not None:
        return Verdict(verdict)
    if not same_letters(answer, gold) or too_costly(answer) or too_costly(gold):
        return Verdict(False)
    try:
        return verify_bounded(gold, answer, float(timeout))
    except CheckTimeout:
        return Verdict(False, f"no verdict within {float(timeout):g} s comparing {answer!r} with {gold!r}")


def check_verdict(completion_text: str, gold: "str | Gold", *, timeout: float = CHECK_TIMEOUT_S,
                  answer_format: str = "boxed") -> Verdict:
    """:func:`check` with the checker's error: ``Verdict(correct, error)``, ``error`` the first
    error of a comparison when no gold answer matched (None when one did, or none failed).

    Raises:
        ValueError: an unknown ``answer_format``.
    """
    answers, think_tags = (gold.answers, gold.think_tags) if isinstance(gold, Gold) else ((gold,), False)
    text = graded_text(completion_text, think_tags)
    answer = None if text is None else final_answer(text, answer_format)
    if answer is None:
        return Verdict(False)
    error = None
    for g in answers:
        verdict = judge(answer, g, timeout=timeout)
        if verdict.correct:
            return Verdict(True)
        error = error or verdict.error
    return Verdict(False, error)


def check(completion_text: str, gold: "str | Gold", *, timeout: float = CHECK_TIMEOUT_S,
          answer_format: str = "boxed") -> bool:
    """Is the completion's final answer (by default the last ``\\boxed{}`` of its graded text) a gold answer?

    Args:
        completion_text: the decoded completion.
        gold: the reference answer, without ``\\boxed{}`` (e.g. ``"363"``, ``"\\frac{1}{2}"``),
            or a :class:`~scalectl.rl.reward.gold.Gold` (several answers, think tags).
        timeout: seconds math-verify may take on each comparison (see :func:`judge`).
        answer_format: where the final answer is (``reward.format``,
            :func:`scalectl.rl.reward.formats.final_answer`): ``boxed``, ``gsm8k``, ``last_line``.

    Returns:
        False when the graded text has no final answer in that format (no closed
        ``\\boxed{}``, no ``####``, no line; with think tags, a thinking block not
        closed); else whether :func:`judge` says correct for any gold answer.

    Raises:
        ValueError: an unknown ``answer_format``.
    """
    return check_verdict(completion_text, gold, timeout=timeout, answer_format=answer_format).correct


def reward(completion_text: str, gold: "str | Gold", *, timeout: float = CHECK_TIMEOUT_S,
           answer_format: str = "boxed") -> float:
    """+1.0 if :func:`check` passes, else -1.0 (rewards in {-1, +1}, docs/recipe-axes.md)."""
    return 1.0 if check(completion_text, gold, timeout=timeout, answer_format=answer_format) else -1.0


def score(completion: str, gold: "str | Gold", fields: dict | None = None, *, answer_format: str = "boxed",
          timeout: float = CHECK_TIMEOUT_S) -> Score:
    """The built-in reward function (``reward.function = "scalectl.rl.reward.checker:score"``,
    the default): ``Score(+1.0, True)`` when :func:`check` passes, else ``Score(-1.0, False)``,
    with the checker's error, if any (:func:`check_verdict`), as ``Score.error``.

    It has the signature of every reward function (docs/rewards.md), so that a function of
    the user's can build on it (``score(completion, gold, fields).correct``); ``fields`` (the
    row's other columns) is not read.  A run calls it with the recipe's ``reward.format``
    and ``reward.timeout_s`` (:mod:`scalectl.rl.reward.scoring`).
    """
    verdict = check_verdict(completion, gold, timeout=timeout, answer_format=answer_format)
    return Score(1.0 if verdict.correct else -1.0, verdict.correct, verdict.error)
