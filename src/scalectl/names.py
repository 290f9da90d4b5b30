"""Validation of user-given names that end up in paths, job names and scripts, and Slurm host lists."""

from __future__ import annotations

import re

from scalectl.errors import UserError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,99}")  # fullmatch: "$" would let a trailing newline in


def check_name(name: str, what: str = "run name") -> str:
    """Return ``name`` if it is safe as a file name, Slurm job name and shell word.

    Allowed: 1-100 characters from letters, digits and ``. _ + = -``, starting
    with a letter or digit, and not ``.``-only.  Anything else (``x; rm -rf ~``,
    ``../../etc``, spaces, slashes, quotes) is refused.

    Raises:
        UserError: naming the value and the allowed characters.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise UserError(
            f"{what} {name!r} is not allowed: use 1-100 letters, digits and . _ + = - "
            "(starting with a letter or digit, no '..')")
    return name


def job_name(text: str, fallback: str = "scalectl") -> str:
    """``text`` made a name :func:`check_name` accepts, for ``sbatch --job-name``: each run of
    characters other than letters, digits and ``. _ + = -`` becomes ``-``, ``..`` becomes ``.``,
    leading characters other than a letter or digit go, and the rest is cut to 100 characters;
    ``fallback`` when nothing is left (``"lm head/v2"`` -> ``lm-head-v2``)."""
    name = re.sub(r"[^A-Za-z0-9._+=-]+", "-", str(text))
    name = re.sub(r"\.{2,}", ".", name)
    name = re.sub(r"^[^A-Za-z0-9]+", "", name)[:100]
    return name if name else fallback


# --------------------------------------------------------------------------- Slurm host lists


def _split_top(text: str) -> list[str]:
    """``a[1-2],b`` -> ``["a[1-2]", "b"]``: commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if depth < 0:
            raise ValueError("a ']' without its '['")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("a '[' without its ']'")
    return parts + [text[start:]]


def _expand_one(word: str) -> list[str]:
    m = re.match(r"^([^\[\]]*)\[([^\]]+)\](.*)$", word)
    if not m:
        if not re.match(r"^[A-Za-z0-9_.-]+$", word):
            raise ValueError(f"{word!r} is not a host name")
        return [word]
    prefix, ranges, rest = m.groups()
    names = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"[{ranges}] is not a list of numbers and ranges such as [1-3,7]")
        for n in range(int(lo), int(hi or lo) + 1):
            names.append(f"{prefix}{n:0{len(lo)}d}")
    return [a + b for a in names for b in _expand_one(rest)] if rest else names


def expand_hostlist(text: str) -> list[str]:
    """The hosts of a Slurm host list, in order, as ``scontrol show hostnames`` gives them:
    ``c[1-3],gpu[08-10]`` -> c1, c2, c3, gpu08, gpu09, gpu10 (zero padding kept;
    ``rack[1-2]-n[1-2]`` -> rack1-n1, rack1-n2, rack2-n1, rack2-n2).

    Raises:
        ValueError: an empty or malformed list (the message says what is wrong).
    """
    text = text.strip()
    if not text:
        raise ValueError("an empty host list")
    hosts = []
    for word in _split_top(text):
        if not word:
            raise ValueError(f"an empty name in {text!r}")
        hosts += _expand_one(word)
    return hosts
