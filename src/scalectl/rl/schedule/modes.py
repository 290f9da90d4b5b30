"""Async modes as schedules: when batches are generated, by which weights, and where.

The training loop (:func:`scalectl.rl.loop.train`) is the same for every
``async.mode``; what differs is the :class:`Schedule` chosen by name from
:data:`SCHEDULES`.  A schedule declares

* its staleness bound: the most policy versions a trained token may lag the
  trainer (every consumed token is checked against it);
* whether it runs in several processes (generators apart from the trainers) on
  a given ``hardware`` (:meth:`Schedule.in_processes`);
* how the loop fetches the next batch: :meth:`Schedule.batches` returns a
  :class:`BatchSource`.

Schedules (v = trainer version, P = prompts per step):

* ``sync``: one batch generated with version v, one step; staleness 0.
* ``ppo_off_policy`` (k): k batches generated with version v, then k steps on
  them; batch j is trained by version v + j, so the importance ratio
  pi_train / pi_gen corrects up to k - 1 versions of staleness.

  Both run in one process (:class:`LocalBatches`) with one generator and one
  trainer; with more of either, M generator processes sample each round of
  requests (P prompts for ``sync``, k P for ``ppo_off_policy``, all with version
  v, weights pushed only between rounds) and N data-parallel trainer processes
  train on it (:class:`scalectl.rl.schedule.feeder.RoundFeeder`), as in ``pipeline``.
* ``pipeline`` (PipelineRL-k, Piche et al. 2025, as run by ScaleRL, Khatri et
  al. 2025, arXiv 2510.13786, section 3.1): generator processes stream groups,
  the trainer pushes weights after every step; staleness <= k
  (:class:`scalectl.rl.schedule.feeder.Feeder`).

A new mode is a new :class:`Schedule` subclass decorated with :func:`register`
(and its name added to ``async.mode`` in :mod:`scalectl.recipe.schema`; a test checks
that the two agree).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Protocol

from scalectl.errors import UserError
from scalectl.rl.batches.collect import generate_batch
from scalectl.rl.schedule.feeder import Feeder, RoundFeeder


class BatchSource(Protocol):
    """Where the loop's batches come from, for one run (built by :meth:`Schedule.batches`)."""

    def next_batch(self, version: int) -> tuple[list, dict]:
        """The groups to train version ``version`` on, and their rollout statistics
        (:func:`scalectl.rl.batches.collect.collect_batch`); counted in the loop state."""

    def after_step(self, version: int) -> None:
        """The step that made ``version`` is taken (its weights are in the policy)."""

    def step_metrics(self, version: int) -> dict:
        """Extra metrics of the step just taken (staleness, idle times), or {}."""

    def checkpoint_fields(self) -> dict:
        """Loop-state fields a checkpoint must take from the source, not the state."""

    def close(self) -> None:
        """Release what the source holds (processes, connections)."""


class Schedule(ABC):
    """One async mode.

    Attributes:
        name: the ``async.mode`` value.
        k: the recipe's ``async.k`` as this schedule uses it.
    """

    name: ClassVar[str] = ""

    def __init__(self, k: int):
        self.k = k

    def in_processes(self, generators: int, trainers: int) -> bool:
        """True when the run's generators and trainers are processes of their own (one task
        each in a multi-task job); False when one process generates and trains.  Default: one
        process for 1 generator + 1 trainer, processes otherwise (``scalectl.job.layout.one_process``
        says the same for the dry run; a test checks that they agree)."""
        return not (generators == 1 and trainers == 1)

    @property
    @abstractmethod
    def staleness_bound(self) -> int:
        """Most versions a trained token may lag the trainer."""

    def check(self, recipe) -> None:
        """Raise :class:`UserError` when the recipe's hardware cannot run this schedule."""

    @abstractmethod
    def batches(self, recipe, policy, state, problems: list, link=None) -> BatchSource:
        """The run's batch source.

        Args:
            policy: the loop's :class:`~scalectl.rl.loop.Policy`; state: its
                :class:`~scalectl.rl.loop.LoopState`; problems: the training prompts.
            link: when the run is in processes (:meth:`in_processes`), the first trainer
                rank's :class:`~scalectl.rl.schedule.feeder.StreamLink` to the generators; None
                when this process generates.
        """

    def describe(self) -> str:
        """One word for logs: ``sync``, ``ppo_off_policy-8``."""
        return self.name if self.name == "sync" else f"{self.name}-{self.k}"


#: ``async.mode`` -> its schedule class.
SCHEDULES: dict[str, type[Schedule]] = {}


def register(cls: type[Schedule]) -> type[Schedule]:
    """Class decorator: make ``cls`` the schedule of ``async.mode = cls.name``."""
    SCHEDULES[cls.name] = cls
    return cls


def schedule_for(async_) -> Schedule:
    """The schedule of a recipe's ``async`` section (``mode``, ``k``).

    Raises:
        UserError: an unknown mode (names the allowed ones).
    """
    try:
        cls = SCHEDULES[async_.mode]
    except KeyError:
        raise UserError(f"async.mode = {async_.mode!r} is not one of: {', '.join(SCHEDULES)}") from None
    return cls(async_.k)


# --------------------------------------------------------------------------- in one process


class LocalBatches:
    """Batches generated by the run's own engine, ``rounds`` at a time with the same weights.

    The batches not yet trained are kept in ``state.pending`` (so a checkpoint holds them);
    batch j of a round (generated at step v) is sampled with seed ``seed * 100003 + v + j``.
    """

    def __init__(self, recipe, policy, state, problems: list, rounds: int):
        self.recipe, self.policy, self.state, self.problems, self.rounds = recipe, policy, state, problems, rounds

    def next_batch(self, version: int) -> tuple[list, dict]:
        state = self.state
        if not state.pending:
            state.pending = [generate_batch(self.recipe, self.policy.engine, self.problems, state,
                                            seed=self.recipe.seed * 100003 + state.step + j)
                             for j in range(self.rounds)]
        return state.pending.pop(0)

    def after_step(self, version: int) -> None:
        pass

    def step_metrics(self, version: int) -> dict:
        return {}

    def checkpoint_fields(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def _rounds(recipe, policy, state, problems, link, rounds: int, bound: int) -> BatchSource:
    """Rounds of ``rounds`` batches with one policy version: generated here without a link,
    by the generator processes behind ``link`` otherwise."""
    if link is None:
        return LocalBatches(recipe, policy, state, problems, rounds=rounds)
    return RoundFeeder(recipe, state, policy.model, link, bound=bound, window=rounds * recipe.batch.prompts_per_step,
                       rounds=rounds)


@register
class Sync(Schedule):
    """On-policy: one batch generated with the current weights, one step."""

    name = "sync"

    def __init__(self, k: int = 1):
        super().__init__(1)

    @property
    def staleness_bound(self) -> int:
        return 0

    def batches(self, recipe, policy, state, problems, link=None) -> BatchSource:
        return _rounds(recipe, policy, state, problems, link, rounds=1, bound=self.staleness_bound)


@register
class PPOOffPolicy(Schedule):
    """k batches generated with one policy, then k optimiser steps on them."""

    name = "ppo_off_policy"

    @property
    def staleness_bound(self) -> int:
        return self.k - 1

    def batches(self, recipe, policy, state, problems, link=None) -> BatchSource:
        return _rounds(recipe, policy, state, problems, link, rounds=self.k, bound=self.staleness_bound)


@register
class Pipeline(Schedule):
    """PipelineRL-k: generator processes stream, weights pushed after every step, the
    request window c_v + (k + 1) P keeps every trained token at most k versions old."""

    name = "pipeline"

    def in_processes(self, generators: int, trainers: int) -> bool:
        return True

    @property
    def staleness_bound(self) -> int:
        return self.k

    def batches(self, recipe, policy, state, problems, link=None) -> BatchSource:
        if link is None:
            raise ValueError("the pipeline schedule needs the trainer's link to its generators")
        return Feeder(recipe, state, policy.model, link, bound=self.staleness_bound,
                      window=(self.k + 1) * recipe.batch.prompts_per_step)
