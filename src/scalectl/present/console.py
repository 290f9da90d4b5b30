"""The two consoles of scalectl's output: human output on stdout, progress, logs and errors on stderr.

Commands print human output with rich on stdout (``--json``: only JSON there); progress
and logs go to stderr, so that the JSON on stdout stays parseable.
"""

from __future__ import annotations

from rich.console import Console

#: Human output.  Lines are not wrapped: a terminal folds them itself, and text written to a
#: file or a pipe (a command to copy, the TOML ``validate`` prints) stays as it was made.
out = Console(highlight=False, soft_wrap=True)
#: Progress, logs and errors.
err = Console(stderr=True, highlight=False, soft_wrap=True)
