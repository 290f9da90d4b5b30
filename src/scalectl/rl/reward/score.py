"""What a reward function returns: a float reward, or a :class:`Score` that also says whether
the completion counts as correct for the pass rate.

A reward function (``reward.function``, docs/rewards.md) returns

* a finite float (an int, a numpy float) from ``-MAX_ABS_REWARD`` to ``MAX_ABS_REWARD``: the
  reward; the completion is correct (for the pass rate mean@k, the retiring of solved prompts
  and DAPO's length shaping) when it is > 0;
* or a :class:`Score` (reward and correct given apart: a partial credit of 0.5 that is not
  a solution is ``Score(0.5, False)``).

Anything else (a string, a bool, None, NaN, infinity, a number beyond the bound, an int too
large for a float) is refused by :func:`as_score`, and :class:`RewardFunctionError` names the
function.
"""

from __future__ import annotations

import decimal
import math
import numbers
from dataclasses import dataclass

from scalectl.errors import UserError
from scalectl.recipe.reward_function import MAX_ABS_REWARD  # noqa: F401 - also a public name here


@dataclass(frozen=True)
class Score:
    """One completion's score.

    Attributes:
        reward: the reward (a finite float; the built-in checker: +1 or -1).
        correct: whether it counts as solved in the pass rate (mean@k).
        error: None, or why the built-in checker could not judge the answer (an exception
            inside math-verify, a partial parse, a timeout; it then scored -1): counted in
            the run's metrics (``checker_errors``).
    """

    reward: float
    correct: bool
    error: str | None = None


class RewardFunctionError(UserError):
    """A reward function could not be imported, raised, overran its time bound, died, or
    returned something that is not a reward; the message names the function (the run
    fails with it)."""


def as_score(value) -> Score:
    """``value`` as a :class:`Score`: a Score as it is (checked), a finite real number as
    ``Score(float(value), value > 0)``.

    Raises:
        TypeError: a bool, or anything that is neither a number nor a Score (the message
            says what it was and what is expected).
        ValueError: a reward that is NaN, infinite, or beyond +-:data:`MAX_ABS_REWARD` (an int
            too large for a float included); the message shows the value and the range.
    """
    if isinstance(value, Score):
        reward, correct = value.reward, value.correct
        if not isinstance(correct, bool):
            raise TypeError(f"returned a Score whose correct is {type(correct).__name__} {correct!r}, not a bool")
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"returned {type(value).__name__} {_short(repr(value))}: a reward function returns a "
                        "float (correct when > 0) or a scalectl.rl.reward.score.Score(reward, correct)")
    else:
        reward, correct = value, None
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise TypeError(f"returned a Score whose reward is {type(reward).__name__} {_short(repr(reward))}, "
                        "not a float")
    try:
        as_float = float(reward)
    except OverflowError:            # an int (a Fraction) beyond any float
        as_float = math.inf if reward > 0 else -math.inf
    if not math.isfinite(as_float) or abs(as_float) > MAX_ABS_REWARD:
        raise ValueError(f"returned the reward {_shown(reward)}: a reward must be a finite number from "
                         f"-{MAX_ABS_REWARD:g} to {MAX_ABS_REWARD:g} (the advantages are computed in float32)")
    return Score(as_float, bool(as_float > 0) if correct is None else bool(correct))


def _shown(reward) -> str:
    """A reward as the message shows it: a float's repr, an int beyond 1e15 in scientific notation
    with its digit count (``int 1.000e+400 (401 digits)``), anything else its short repr."""
    if isinstance(reward, numbers.Integral) and not isinstance(reward, bool):
        number = int(reward)
        if abs(number) > MAX_ABS_REWARD:
            return f"{type(reward).__name__} {decimal.Decimal(number):.3e} ({len(str(abs(number)))} digits)"
        return repr(number)
    if isinstance(reward, float):
        return repr(reward)
    try:
        return _short(repr(float(reward)) if math.isfinite(float(reward)) else repr(reward))
    except (OverflowError, ValueError, TypeError):
        return _short(repr(reward))


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
