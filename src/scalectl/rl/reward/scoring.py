"""The recipe's reward: one :class:`~scalectl.rl.reward.score.Score` per completion of a problem.

:func:`scorer_for` turns the recipe's ``[reward]`` section into a :class:`Scorer`, which every
process that scores builds for itself (the generators of every async mode, in this process
or in processes of their own, and the held-out evaluation), so that a reward function named
in the recipe is imported and called wherever completions are scored:

* the built-in checker (``reward.function`` at its default,
  :func:`scalectl.rl.reward.checker.score`) runs here, with the recipe's ``reward.format``,
  ``reward.timeout_s`` bounding each math-verify comparison and the problem's
  :class:`~scalectl.rl.reward.gold.Gold` (several answers, think tags);
* a function of the user's runs in worker processes under ``reward.timeout_s``
  (:func:`scalectl.rl.reward.calls.call_function`) and is called as
  ``function(completion, gold, fields)``: the whole completion, one gold answer (a string,
  normalised as the loader normalises them: :func:`scalectl.rl.data.files.normalize_answer`)
  and the problem's row (a dict of its columns as read, ``{}`` for a synthetic problem).
  A problem with several acceptable answers calls it once per answer: the highest reward
  counts, and the completion is correct when any call says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalectl.errors import UserError
from scalectl.recipe.reward_function import BUILTIN_REWARD, think_tags_problem
from scalectl.rl.reward.calls import call_function
from scalectl.rl.reward.checker import score as builtin_score
from scalectl.rl.reward.gold import Gold
from scalectl.rl.reward.score import Score


@dataclass(frozen=True)
class Scorer:
    """Scores completions as a recipe's ``[reward]`` section says (a callable; picklable).

    Attributes:
        function: ``reward.function`` (``package.module:callable``).
        answer_format: ``reward.format`` (the built-in checker's; prompts' instruction).
        timeout_s: ``reward.timeout_s``, seconds per call.
    """

    function: str = BUILTIN_REWARD
    answer_format: str = "boxed"
    timeout_s: float = 5.0

    @property
    def builtin(self) -> bool:
        """Whether this is the built-in checker (run in this process)."""
        return self.function == BUILTIN_REWARD

    def __call__(self, completion_text: str, problem) -> Score:
        """The score of one completion of ``problem`` (an object with ``answer``, a string or
        a :class:`~scalectl.rl.reward.gold.Gold`, and optionally ``fields``, its row).

        Raises:
            RewardFunctionError: a function of the user's failed (see
                :func:`~scalectl.rl.reward.calls.call_function`).
        """
        gold = problem.answer
        if self.builtin:
            return builtin_score(completion_text, gold, answer_format=self.answer_format, timeout=self.timeout_s)
        fields = dict(getattr(problem, "fields", None) or {})
        answers = gold.answers if isinstance(gold, Gold) else (gold,)
        scores = [call_function(self.function, completion_text, str(g), fields, timeout=self.timeout_s)
                  for g in answers]
        return Score(max(s.reward for s in scores), any(s.correct for s in scores))


def scorer_for(recipe) -> Scorer:
    """The :class:`Scorer` of ``recipe`` (its ``reward`` section).

    Raises:
        UserError: ``model.think_tags`` with a function of the user's (which receives the
            whole completion, so the key would have no effect).
    """
    r = recipe.reward
    if r.function != BUILTIN_REWARD and recipe.model.think_tags:
        raise UserError(think_tags_problem(r.function))
    return Scorer(r.function, r.format, r.timeout_s)
