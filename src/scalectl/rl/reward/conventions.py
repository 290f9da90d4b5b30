"""How a reward function of each convention (``reward.convention``) is called, and what its
value means (docs/rewards.md, "Functions written for verl or TRL").

* ``scalectl``: ``f(completion, gold, fields)``, or ``f(completion, gold, **fields)`` (the row's
  columns as keywords, but those named as the first two parameters: the gold is passed as
  the second); a float (correct when > 0) or a :class:`~scalectl.rl.reward.score.Score`
  (:func:`~scalectl.rl.reward.score.as_score`).
* ``verl``: as verl's NaiveRewardManager calls ``custom_reward_function``
  (verl/workers/reward_manager/naive.py): ``compute_score(data_source=..., solution_str=completion,
  ground_truth=gold, extra_info=...)``, all keywords.  ``data_source`` is the row's
  ``data_source`` column, else the prompt set's name (:func:`dataset_name`); ``extra_info``
  the row's ``extra_info`` column when it is a table (verl's parquet layout), else the row's
  other columns.  It returns a number (a bool too: verl stores it as a float) or a dict
  whose ``score`` is the reward; correct when its ``acc`` says so if it has one (verl's
  validation metric is ``acc`` when the function gives it, else the reward), else when the
  reward is > 0, as for a float.
* ``trl``: as TRL's GRPOTrainer calls its reward functions (trl/trainer/grpo_trainer.py,
  ``_calculate_rewards``), over a batch: ``reward_func(prompts=[...], completions=[...],
  completion_ids=[[...]], **columns)``: the standard (string) prompts and completions, the
  completions' token ids, and every column of the row but ``prompt``, ``completion`` and
  ``completion_ids`` as a list with one entry per completion (a problem without a row, as
  the synthetic ones, has the column ``answer``: its gold answer).  ``trainer_state``,
  ``log_extra``, ``log_metric`` and ``environments`` are not passed.  It returns one value
  per completion: a float (correct when > 0) or None (not applicable: reward 0, not
  correct, as TRL's sum over reward functions counts it when it is the only one; TRL since
  1.10 also leaves such a completion out of its group's mean, which scalectl does not).

Pure Python (no torch): these run in the worker processes of :mod:`scalectl.rl.reward.calls`.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from pathlib import PurePath

from scalectl.recipe.reward_function import fields_as_keywords
from scalectl.rl.reward.score import Score, as_score

#: Columns TRL does not pass to a reward function as keywords (it passes prompts and
#: completions itself).
TRL_SKIPPED_COLUMNS = ("prompt", "completion", "completion_ids")


def dataset_name(source: str) -> str:
    """The prompt set's name for verl's ``data_source`` (``data.source``): ``NAME`` of
    ``hf:NAME`` (``openai/gsm8k``, as verl's data sets name themselves), a file's stem
    (``gsm8k-test`` of ``data/gsm8k-test.jsonl``), or the source itself
    (``synthetic:arithmetic``)."""
    if source.startswith("hf:"):
        return source[3:]
    if source.startswith("synthetic:"):
        return source
    return PurePath(source).stem


def verl_score(value) -> Score:
    """A verl-convention value as a :class:`Score`: a number (or a bool) is the reward, correct
    when > 0; a dict's ``score`` is the reward, its ``acc`` (when given) whether correct.

    Raises:
        TypeError: a dict without ``score``, an ``acc`` that is no number, or anything
            :func:`~scalectl.rl.reward.score.as_score` refuses.
        ValueError: NaN or an infinite reward.
    """
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"returned a dict without a 'score' key (keys: {', '.join(map(repr, value)) or 'none'}): "
                            "a verl reward function returns a float or a dict with the reward as 'score'")
        reward = value["score"]
        reward = float(reward) if isinstance(reward, bool) else reward
        score = as_score(reward)
        if "acc" not in value:
            return score
        acc = value["acc"]
        if not isinstance(acc, numbers.Real):
            raise TypeError(f"returned a dict whose 'acc' is {type(acc).__name__} {acc!r}, not a bool or a number")
        return Score(score.reward, bool(acc > 0))
    return as_score(float(value) if isinstance(value, bool) else value)


def trl_scores(values, n: int) -> list[Score]:
    """A TRL-convention value (one per completion of a batch of ``n``) as ``n`` Scores: None
    is reward 0, not correct; a number is the reward, correct when > 0.

    Raises:
        TypeError: not a list (or tuple, or an array with ``tolist``) of ``n`` values, or an
            entry :func:`~scalectl.rl.reward.score.as_score` refuses.
        ValueError: NaN or an infinite reward.
    """
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"returned {type(values).__name__} {str(values)[:60]!r}: a TRL reward function returns a "
                        f"list of one float (or None) per completion, here {n}")
    if len(values) != n:
        raise TypeError(f"returned {len(values)} value(s) for a batch of {n} completions: a TRL reward function "
                        "returns one float (or None) per completion")
    out = []
    for i, value in enumerate(values):
        try:
            out.append(Score(0.0, False) if value is None else as_score(value))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{exc} (entry {i} of its list)") from None
    return out


@dataclass(frozen=True)
class Caller:
    """A reward function with its convention (:data:`scalectl.recipe.reward_function.CONVENTIONS`):
    calls it as that convention does and reads its value.

    Attributes:
        function: the user's callable.
        convention: ``scalectl``, ``verl`` or ``trl``.
    """

    function: object
    convention: str
    #: ``scalectl`` with the row as keywords: the names of the first two parameters (not passed
    #: again); None: the row as one dict, or another convention.
    taken: tuple[str, ...] | None = field(default=None, init=False, compare=False)

    def __post_init__(self):
        if self.convention == "scalectl" and fields_as_keywords(self.function):
            import inspect

            object.__setattr__(self, "taken", tuple(inspect.signature(self.function).parameters)[:2])

    @property
    def batched(self) -> bool:
        """Whether one call scores a batch (TRL) rather than one completion against one gold."""
        return self.convention == "trl"

    def one(self, completion: str, gold: str, fields: dict, data_source: str):
        """The function's value for one completion against one gold answer (``scalectl``,
        ``verl``; read it with :meth:`score`).

        Args:
            completion: the decoded completion.
            gold: one gold answer (a string).
            fields: the problem's row (column -> JSON value; ``{}`` for none).
            data_source: the prompt set's name (:func:`dataset_name`), verl's
                ``data_source`` when the row has no such column.

        Raises:
            Exception: what the function raises.
        """
        if self.convention == "verl":
            extra = fields.get("extra_info")
            if not isinstance(extra, dict):
                extra = {k: v for k, v in fields.items() if k != "data_source"}
            source = fields.get("data_source")
            return self.function(data_source=source if isinstance(source, str) else data_source,
                                 solution_str=completion, ground_truth=gold, extra_info=extra)
        if self.taken is not None:
            return self.function(completion, gold, **{k: v for k, v in fields.items() if k not in self.taken})
        return self.function(completion, gold, fields)

    def batch(self, prompt: str, completions: list[str], completion_ids: list[list[int]], fields: dict):
        """The function's value for the completions of one prompt, in one call (``trl``; read
        it with :meth:`scores`).

        Args:
            prompt: the prompt as the model saw it (a string: TRL's standard format).
            completions: the decoded completions.
            completion_ids: their token ids, one list each.
            fields: the problem's row (column -> JSON value), each column passed as a list.

        Raises:
            Exception: what the function raises.
        """
        n = len(completions)
        columns = {k: [v] * n for k, v in fields.items() if k not in TRL_SKIPPED_COLUMNS}
        return self.function(**columns, prompts=[prompt] * n, completions=list(completions),
                             completion_ids=[list(ids) for ids in completion_ids])

    def score(self, value) -> Score:
        """What :meth:`one` returned, as a Score.

        Raises:
            TypeError, ValueError: a value that is not a reward (:func:`verl_score`,
                :func:`~scalectl.rl.reward.score.as_score`).
        """
        return verl_score(value) if self.convention == "verl" else as_score(value)

    def scores(self, value, n: int) -> list[Score]:
        """What :meth:`batch` returned for ``n`` completions, as Scores (:func:`trl_scores`)."""
        return trl_scores(value, n)
