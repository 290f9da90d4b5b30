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
  counts, and the completion is correct when any call says so.  A function written for verl
  or TRL (``reward.convention``) is called as that trainer calls it
  (:mod:`scalectl.rl.reward.conventions`): verl's once per completion and gold answer, TRL's
  once per group of completions of a prompt (:meth:`Scorer.group`,
  :func:`scalectl.rl.reward.calls.call_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass

from scalectl.errors import UserError
from scalectl.recipe.reward_function import BUILTIN_REWARD, think_tags_problem
from scalectl.rl.reward.calls import call_batch, call_function, function_convention
from scalectl.rl.reward.checker import score as builtin_score
from scalectl.rl.reward.conventions import dataset_name
from scalectl.rl.reward.gold import Gold
from scalectl.rl.reward.score import Score


@dataclass(frozen=True)
class Scorer:
    """Scores completions as a recipe's ``[reward]`` section says (a callable; picklable).

    Attributes:
        function: ``reward.function`` (``package.module:callable``).
        answer_format: ``reward.format`` (the built-in checker's; prompts' instruction).
        timeout_s: ``reward.timeout_s``, seconds per call (per completion for ``trl``).
        convention: ``reward.convention`` (None: recognised from the function's signature).
        dataset: the prompt set's name, verl's ``data_source`` for a row without that column
            (:func:`~scalectl.rl.reward.conventions.dataset_name` of ``data.source``).
        truncated: ``reward.truncated``: the reward of a completion cut at the length limit
            (``finish_reason == "length"``), which then counts as not correct; None (the recipe's
            ``as_written``): such a completion is scored as written (:meth:`completions`).
    """

    function: str = BUILTIN_REWARD
    answer_format: str = "boxed"
    timeout_s: float = 5.0
    convention: str | None = None
    dataset: str = ""
    truncated: float | None = None

    @property
    def builtin(self) -> bool:
        """Whether this is the built-in checker (run in this process)."""
        return self.function == BUILTIN_REWARD

    def __call__(self, completion_text: str, problem) -> Score:
        """The score of one completion of ``problem`` (:meth:`group` of one)."""
        return self.group([completion_text], problem)[0]

    def group(self, texts: list[str], problem, token_ids: list[list[int]] | None = None) -> list[Score]:
        """The scores of completions of one ``problem`` (an object with ``prompt``, ``answer``, a
        string or a :class:`~scalectl.rl.reward.gold.Gold`, and optionally ``fields``, its row),
        in order.

        The built-in checker and functions of the ``scalectl`` and ``verl`` conventions score
        each completion against each gold answer (the highest reward counts, correct when any
        call says so); a ``trl`` function scores them all in one call, with the row (and
        ``token_ids``, the completions' tokens, TRL's ``completion_ids``; empty lists when not
        given).

        Raises:
            RewardFunctionError: a function of the user's failed (see
                :func:`~scalectl.rl.reward.calls.call_function`).
        """
        gold = problem.answer
        if self.builtin:
            return [builtin_score(t, gold, answer_format=self.answer_format, timeout=self.timeout_s) for t in texts]
        fields = dict(getattr(problem, "fields", None) or {})
        answers = gold.answers if isinstance(gold, Gold) else (gold,)
        convention = function_convention(self.function, self.convention, timeout=self.timeout_s)
        if convention == "trl":
            ids = token_ids if token_ids is not None else [[] for _ in texts]
            return call_batch(self.function, str(problem.prompt), list(texts), ids, fields or {"answer": str(answers[0])},
                              timeout=self.timeout_s, convention=self.convention)
        out = []
        for text in texts:
            scores = [call_function(self.function, text, str(g), fields, timeout=self.timeout_s,
                                    convention=self.convention, data_source=self.dataset) for g in answers]
            out.append(Score(max(s.reward for s in scores), any(s.correct for s in scores)))
        return out

    def completions(self, comps: list, problem) -> list[Score]:
        """The scores of sampled completions of one ``problem`` (objects with ``text``,
        ``token_ids`` and ``finish_reason``, as
        :class:`~scalectl.rl.rollout.base.Completion`): :meth:`group` on their texts, except that
        with :attr:`truncated` set a completion cut at the length limit (``finish_reason ==
        "length"``) scores ``Score(truncated, False)`` whatever its text holds: it has not ended
        its answer.  Those completions are not sent to the reward function (a ``trl`` one gets the
        rest of the group).

        Raises:
            RewardFunctionError: as :meth:`group`.
        """
        cut = [self.truncated is not None and c.finish_reason == "length" for c in comps]
        kept = [c for c, x in zip(comps, cut) if not x]
        scored = iter(self.group([c.text for c in kept], problem, [c.token_ids for c in kept]) if kept else [])
        return [Score(float(self.truncated), False) if x else next(scored) for x in cut]


def scorer_for(recipe) -> Scorer:
    """The :class:`Scorer` of ``recipe`` (its ``reward`` section; ``data.source`` names the set
    for verl's ``data_source``).

    Raises:
        UserError: ``model.think_tags`` with a function of the user's (which receives the
            whole completion, so the key would have no effect).
    """
    r = recipe.reward
    if r.function != BUILTIN_REWARD and recipe.model.think_tags:
        raise UserError(think_tags_problem(r.function))
    return Scorer(r.function, r.format, r.timeout_s, r.convention, dataset_name(recipe.data.source),
                  None if r.truncated == "as_written" else float(r.truncated))
