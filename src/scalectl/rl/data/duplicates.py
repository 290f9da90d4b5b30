"""Near-duplicate prompts: the key two copies of one problem share.

A prompt set often holds one problem more than once, written slightly differently: a
trailing space or newline, a doubled space, ``What`` and ``what``, a question mark or a
full stop at the end, quotes around it, the boxed-answer instruction already appended.
Exact text comparison keeps such copies apart, and the held-out split then shares
problems with training.  :func:`prompt_key` is what is left of a prompt once the
differences that do not change the problem are removed; prompts with one key are one
problem (the first is kept, :func:`first_of_each`).

What the key ignores, per message (its role is kept):

* Unicode composition (NFC) and invisible characters (zero-width space, BOM, soft hyphen);
* whitespace: runs become one space in prose; in math (``$...$``, ``$$...$$``,
  ``\\(...\\)``, ``\\[...\\]``) whitespace goes, except one space between two letters
  (``\\alpha x`` is not ``\\alphax``);
* case of words of two or more letters in prose (``What``/``what``, ``FIND``/``find``);
  a single letter keeps its case (``X`` and ``x`` may be different variables), and so does
  everything in math and every command (``\\Delta`` is not ``\\delta``);
* surrounding punctuation and quotes: ``.,;:?`` and ``"``, ``“``, ``”`` at either end
  (not ``!``, a factorial, nor ``'``, a prime);
* the given instructions (``drop``: the boxed-answer instruction that rendering appends).
"""

from __future__ import annotations

import re
import unicodedata

_INVISIBLE = re.compile("[\u200b\u200c\u200d\u2060\ufeff\u00ad]")
_MATH = re.compile(r"\$\$.*?\$\$|\$.*?\$|\\\(.*?\\\)|\\\[.*?\\\]", re.DOTALL)
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_SPACE = re.compile(r"\s+")
_ENDS = " \t\r\n.,;:?\"“”"


def _prose(text: str) -> str:
    return _WORD.sub(lambda m: m.group().lower(), _SPACE.sub(" ", text))


def _math(text: str) -> str:
    def gap(m: re.Match) -> str:
        between_letters = 0 < m.start() and m.end() < len(text) and text[m.start() - 1].isalpha() \
            and text[m.end()].isalpha()
        return " " if between_letters else ""

    return _SPACE.sub(gap, text)


def text_key(text: str) -> str:
    """One message's content as the key compares it (see the module docstring):
    ``"  What is  $x + 1$?\\n"`` -> ``"what is $x+1$"``."""
    text = _INVISIBLE.sub("", unicodedata.normalize("NFC", text))
    out, pos = [], 0
    for m in _MATH.finditer(text):
        out.append(_prose(text[pos:m.start()]))
        out.append(_math(m.group()))
        pos = m.end()
    out.append(_prose(text[pos:]))
    return "".join(out).strip(_ENDS)


def prompt_key(messages, drop: tuple[str, ...] = ()) -> str:
    """The key of a prompt given as chat messages (dicts with ``role`` and ``content``):
    each message's role and :func:`text_key` of its content, with every string of ``drop``
    removed first."""
    parts = []
    for m in messages:
        content = m["content"]
        for text in drop:
            content = content.replace(text, " ")
        parts.append(f"{m['role']}: {text_key(content)}")
    return "\n".join(parts)


def first_of_each(keys: list[str]) -> list[int]:
    """Positions of the first occurrence of each key, in order."""
    seen, keep = set(), []
    for i, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return keep
