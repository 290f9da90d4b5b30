"""Rollouts to scored groups: sample G completions per prompt, score, shape rewards.

A *group* is the G completions of one prompt.  Each completion is scored by the
recipe's reward (:mod:`scalectl.rl.reward.scoring`): by default +1 for a correct
final answer and -1 otherwise (checked with math-verify,
:mod:`scalectl.rl.reward.checker`), or what a reward function of the user's
returns (partial credit included); with ``length.control = "penalty"`` the DAPO
overlong shaping is added to correct completions (DAPO, arXiv 2503.14476,
eq. 13).  With ``interrupt`` the rollout engine appends the interruption
phrase itself; ``none`` leaves truncated completions to the checker.  With
``reward.truncated`` set, a truncated completion scores that reward and is not
correct (:meth:`~scalectl.rl.reward.scoring.Scorer.completions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from scalectl.rl.rollout.length import overlong_penalty


@dataclass
class Group:
    """The G completions of one prompt, with their rewards.

    Attributes:
        prompt_id: index of the prompt in the training set.
        completions: G rollout completions (:class:`scalectl.rl.rollout.base.Completion`).
        correct: G booleans: solved, for the pass rate (the reward's ``Score.correct``).
        rewards: (G,) float, the reward (built-in: +1/-1) plus any length shaping.
        generator: the rank of the generator process that sampled it (None: sampled in the
            trainer's process).
        checker_errors: how many of its completions the built-in checker could not judge
            (``Score.error``: scored -1); checker_error: the first such error, or None.
    """

    prompt_id: int
    completions: list
    correct: list[bool]
    rewards: torch.Tensor = field(repr=False)
    generator: int | None = None
    checker_errors: int = 0
    checker_error: str | None = None

    @property
    def n_correct(self) -> int:
        return int(sum(self.correct))

    @property
    def zero_variance(self) -> bool:
        """All G rewards equal: the group's advantages are all zero."""
        return bool((self.rewards == self.rewards[0]).all())


def score_groups(raw_groups: list[list], problems: list, prompt_ids: list[int], length, score) -> list[Group]:
    """Score every completion and shape rewards.

    Args:
        raw_groups: one list of G completions per prompt, as the engine returned them.
        problems: the prompt set (objects with ``answer``, and ``fields`` for a real set).
        prompt_ids: the prompt index of each group.
        length: the recipe's :class:`~scalectl.recipe.schema.Length` section.
        score: the recipe's reward, a :class:`~scalectl.rl.reward.scoring.Scorer`
            (:func:`scalectl.rl.reward.scoring.scorer_for`): ``score.completions(comps, problem)``
            scores a group's completions (in one call of a TRL-shaped function; a truncated one
            as ``reward.truncated`` says).

    Raises:
        RewardFunctionError: the recipe's reward function failed on a completion.
    """
    groups = []
    for pid, comps in zip(prompt_ids, raw_groups):
        scores = score.completions(comps, problems[pid])
        correct = [s.correct for s in scores]
        rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32)
        if length.control == "penalty":
            lmax = length.penalty_max or length.max_new_tokens
            pen = overlong_penalty(torch.tensor([len(c.token_ids) for c in comps]), lmax, length.penalty_cache)
            rewards = rewards + torch.where(torch.tensor(correct), pen.to(rewards.dtype), torch.zeros_like(rewards))
        errors = [s.error for s in scores if getattr(s, "error", None)]
        groups.append(Group(pid, comps, correct, rewards, checker_errors=len(errors),
                            checker_error=errors[0] if errors else None))
    return groups


def rollout_stats(groups: list[Group]) -> dict:
    """Reward mean, truncation rate, mean completion length (tokens), zero-variance share,
    pass rate, and ``checker_errors`` (completions the checker could not judge) with the first
    such error as ``checker_error`` when there is one."""
    comps = [c for g in groups for c in g.completions]
    if not comps:
        return {"reward": 0.0, "truncation_rate": 0.0, "mean_length": 0.0, "zero_variance_share": 0.0,
                "checker_errors": 0}
    errors = [g.checker_error for g in groups if g.checker_error]
    return {
        "checker_errors": sum(g.checker_errors for g in groups),
        **({"checker_error": errors[0]} if errors else {}),
        "reward": float(torch.cat([g.rewards for g in groups]).mean()),
        "truncation_rate": sum(c.finish_reason == "length" for c in comps) / len(comps),
        "mean_length": sum(len(c.token_ids) for c in comps) / len(comps),
        "zero_variance_share": sum(g.zero_variance for g in groups) / len(groups),
        "pass_rate": sum(g.n_correct for g in groups) / len(comps),
    }
