"""A reward function for the tests of `scalectl evaluate` (``series_rewards:right_if_gold_is_odd``,
imported by name in the scoring processes as a user's own would be, docs/rewards.md).

With ``$SCALECTL_TEST_SERIES_CALLS`` set, every call appends one line ``PID PPID GOLD`` to that file.
"""

from __future__ import annotations

import os

from scalectl.rl.reward.score import Score

CALLS_ENV = "SCALECTL_TEST_SERIES_CALLS"


def right_if_gold_is_odd(completion: str, gold: str, fields: dict) -> Score:
    """Whatever the completion: reward 1 and correct when the gold answer is an odd number, else 0."""
    path = os.environ.get(CALLS_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(f"{os.getpid()} {os.getppid()} {gold}\n")
    odd = int(gold) % 2 == 1
    return Score(1.0 if odd else 0.0, odd)
