"""Validation of user-given names that end up in paths, job names and scripts."""

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
