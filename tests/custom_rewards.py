"""Reward functions of a user's, for the tests (docs/rewards.md): named in recipes as
``custom_rewards:NAME`` and imported in every process that scores (``tests/`` is put on
``PYTHONPATH`` for the processes a test starts).

With ``$SCALECTL_TEST_REWARD_CALLS`` set, every call appends one line ``PID PPID`` to that
file: the worker process that ran it and the scoring process that asked.
"""

from __future__ import annotations

import os
import threading

from scalectl.rl.reward.checker import score as math_score
from scalectl.rl.reward.score import Score

CALLS_ENV = "SCALECTL_TEST_REWARD_CALLS"


def _count() -> None:
    path = os.environ.get(CALLS_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(f"{os.getpid()} {os.getppid()}\n")


def digit_share(completion: str, gold: str, fields: dict):
    """Partial credit: the share of the completion's characters that are digits (0 for an
    empty one), in [0, 1]; correct when the built-in checker says so."""
    _count()
    share = sum(c.isdigit() for c in completion) / len(completion) if completion else 0.0
    return Score(share, math_score(completion, gold, fields).correct)


def half_for_a_box(completion: str, gold: str, fields: dict) -> float:
    """+1 for a right boxed answer, 0.5 for a wrong one, -1 without a box (a float: correct when > 0,
    so a wrong boxed answer counts as solved: the reason to return a Score instead)."""
    _count()
    if math_score(completion, gold).correct:
        return 1.0
    return 0.5 if "\\boxed{" in completion else -1.0


def level_field(completion: str, gold: str, fields: dict) -> Score:
    """The row's own ``level`` column as the reward when the answer is right, else 0."""
    _count()
    ok = math_score(completion, gold).correct
    return Score(float(fields["level"]) if ok else 0.0, ok)


def raises(completion: str, gold: str, fields: dict) -> float:
    raise ValueError("no answer here")


def hangs(completion: str, gold: str, fields: dict) -> float:
    _count()
    threading.Event().wait()          # never set
    return 0.0


def returns_string(completion: str, gold: str, fields: dict):
    return "1.0"


def exits(completion: str, gold: str, fields: dict) -> float:
    os._exit(3)


def two_arguments(completion: str, gold: str) -> float:
    return 0.0


NOT_CALLABLE = 3
