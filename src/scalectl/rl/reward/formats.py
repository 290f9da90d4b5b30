"""Answer formats (``reward.format``): where a completion's final answer is, and what a prompt
is told about it.

=============  ===========================================  =====================================
format         the final answer (:func:`final_answer`)      instruction appended to prompts
=============  ===========================================  =====================================
``boxed``      content of the last ``\\boxed{...}``           :data:`BOXED_INSTRUCTION`
               (braces balanced)                             (verl, DeepScaleR, POLARIS sets)
``gsm8k``      the rest of the line after the last ``####``  :data:`GSM8K_INSTRUCTION`
               (GSM8K's solutions end ``#### 42``)           (verl's GSM8K example)
``last_line``  the last non-empty line, without a leading    :data:`LAST_LINE_INSTRUCTION`
               ``Answer:``, ``Final answer:`` or
               ``The (final) answer is``
=============  ===========================================  =====================================

The instruction goes to the last user message of a prompt of a real set that does not
already ask for that format (:func:`asks_for`: it mentions ``\\boxed``, ``####``, or "last
line"), when ``reward.instruction`` is true (:func:`scalectl.rl.data.files.with_instruction`);
the synthetic arithmetic prompts carry none (the built-in model is trained to box its answer).
The built-in checker then compares the answer with the gold (:mod:`scalectl.rl.reward.checker`);
a reward function of the user's may call :func:`final_answer` itself.
"""

from __future__ import annotations

import re

from scalectl.recipe.reward_function import ANSWER_FORMATS

#: Appended to a prompt that does not ask for a boxed answer (the wording of the
#: verl / DeepScaleR / POLARIS prompt sets).
BOXED_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
#: Appended for ``gsm8k``: the wording of verl's GSM8K preprocessing example
#: (examples/data_preprocess/gsm8k.py).
GSM8K_INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
#: Appended for ``last_line`` (this project's wording).
LAST_LINE_INSTRUCTION = "Let's think step by step and write the final answer alone on the last line."

#: format -> its instruction.
INSTRUCTIONS = {"boxed": BOXED_INSTRUCTION, "gsm8k": GSM8K_INSTRUCTION, "last_line": LAST_LINE_INSTRUCTION}
#: format -> what a prompt that already asks for it contains (case-insensitive).
_MARKERS = {"boxed": "\\boxed", "gsm8k": "####", "last_line": "last line"}
_BOX_OR_BRACE = re.compile(r"\\boxed\{|[{}]")
_ANSWER_PREFIX = re.compile(r"^\**\s*(?:final answer|answer|the (?:final )?answer is)\b\s*\**\s*[:=]?\s*\**\s*",
                            re.IGNORECASE)
_MATH_DELIMITERS = re.compile(r"^(?:\$\$(?P<a>.+)\$\$|\$(?P<b>[^$]+)\$|\\\((?P<c>.+)\\\)|\\\[(?P<d>.+)\\\])$")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (nested braces balanced),
    or None when there is none or it is not closed: ``"a \\boxed{1} \\boxed{\\frac{1}{2}}"``
    -> ``"\\frac{1}{2}"``.

    One pass over the braces (linear time: a megabyte of unclosed ``\\boxed{`` takes
    well under a second)."""
    if "\\boxed{" not in text:
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


def after_hashes(text: str) -> str | None:
    """The rest of the line after the last ``####`` (GSM8K), stripped, or None when there is
    none or nothing follows it: ``"so 6*7=42\\n#### 42"`` -> ``"42"``;
    ``"#### 42\\nDone."`` -> ``"42"``."""
    if "####" not in text:
        return None
    answer = text.rsplit("####", 1)[1].lstrip(" \t").split("\n", 1)[0].strip()
    return answer or None


def last_line(text: str) -> str | None:
    """The last non-empty line, stripped, without a leading ``Answer:``, ``Final answer:``,
    ``The answer is`` or ``The final answer is`` (any case, bold ``**`` allowed) and without
    math delimiters around all of it (``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``),
    or None for a text without one: ``"3+4 is 7.\\nAnswer: $7$"`` -> ``"7"``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    answer = _ANSWER_PREFIX.sub("", lines[-1], count=1).strip()
    m = _MATH_DELIMITERS.match(answer.rstrip(".,;: "))       # "$7$." is 7
    if m:
        answer = next(g for g in m.groups() if g is not None).strip()
    return answer or None


_EXTRACT = {"boxed": last_boxed, "gsm8k": after_hashes, "last_line": last_line}


def final_answer(text: str, answer_format: str = "boxed") -> str | None:
    """The final answer of ``text`` in ``answer_format`` (the module's table), or None when
    the text has none.

    Raises:
        ValueError: an unknown format (not one of :data:`ANSWER_FORMATS`).
    """
    try:
        extract = _EXTRACT[answer_format]
    except KeyError:
        raise ValueError(f"reward.format = {answer_format!r} is not one of: {', '.join(ANSWER_FORMATS)}") from None
    return extract(text)


def asks_for(messages, answer_format: str) -> bool:
    """Whether some message (dicts with ``content``) already asks for ``answer_format``: it
    mentions ``\\boxed``, ``####`` or "last line" (any case)."""
    marker = _MARKERS[answer_format].lower()
    return any(marker in m["content"].lower() for m in messages)
