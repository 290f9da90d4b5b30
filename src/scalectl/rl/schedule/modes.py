"""Async modes as schedules: where a run's batches come from.

The training loop (:func:`scalectl.rl.loop.train`) is the same for every ``async.mode``;
what differs is the run's :class:`Schedule`, built once per job (:func:`schedule_for`, in
:func:`scalectl.job.body.run_job`) and passed down.  A schedule holds the mode's
description (:class:`scalectl.recipe.async_modes.AsyncMode`: staleness bound, rounds,
request window, whether a layout runs in processes) and builds the loop's
:class:`BatchSource` from the mode's ``source`` (:data:`SOURCES`):

* ``rounds`` (``sync``, ``ppo_off_policy``): rounds of ``steps_per_round`` batches sampled
  by one policy version: in one process (:class:`LocalBatches`) on 1 generator + 1 trainer;
  over M generator processes and N data-parallel trainer processes otherwise
  (:class:`scalectl.rl.schedule.feeder.RoundFeeder`, weights pushed only between rounds);
* ``stream`` (``pipeline``): generator processes stream groups, the trainer pushes weights
  after every step (:class:`scalectl.rl.schedule.feeder.Feeder`);
* ``lagged`` (``pipeline`` with ``async.schedule = "fixed_lag"``): in one process, batch v
  sampled by version max(0, v - k) (:class:`LaggedBatches`).

Every batch source checks each token it hands to the trainer against the mode's staleness
bound (:func:`scalectl.rl.batches.collect.check_staleness`).  A new async mode is described in
:mod:`scalectl.recipe.async_modes`; only a mode whose batches come neither in rounds nor as a
stream adds a builder here (:func:`source`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from scalectl.recipe.async_modes import AsyncMode, async_mode
from scalectl.rl.batches.collect import check_staleness, generate_batch
from scalectl.rl.schedule.feeder import Feeder, RoundFeeder, staleness_stats


class BatchSource(Protocol):
    """Where the loop's batches come from, for one run (built by :meth:`Schedule.batches`)."""

    def next_batch(self, version: int) -> tuple[list, dict]:
        """The groups to train version ``version`` on, and their rollout statistics
        (:func:`scalectl.rl.batches.collect.collect_batch`); counted in the loop state.

        Raises:
            StalenessError: a token older than the mode's staleness bound.
        """

    def after_step(self, version: int) -> None:
        """The step that made ``version`` is taken (its weights are in the policy)."""

    def step_metrics(self, version: int) -> dict:
        """Extra metrics of the step just taken (staleness, idle times), or {}."""

    def checkpoint_fields(self) -> dict:
        """Loop-state fields a checkpoint must take from the source, not the state."""

    def close(self) -> None:
        """Release what the source holds (processes, connections)."""


#: An :class:`AsyncMode`'s ``source`` -> ``build(mode, recipe, policy, state, problems, link)``,
#: which returns the run's :class:`BatchSource`.
SOURCES: dict[str, Callable[..., BatchSource]] = {}


def source(kind: str):
    """Decorator: make the function the batch-source builder of the modes whose ``source`` is ``kind``."""
    def register(build):
        SOURCES[kind] = build
        return build
    return register


@dataclass(frozen=True)
class Schedule:
    """The async mode of one job, and the batch sources that serve it (picklable: a trainer
    process of its own receives it in its :class:`scalectl.rl.processes.bodies.ProcessSpec`).

    Attributes:
        mode: the recipe's :class:`~scalectl.recipe.async_modes.AsyncMode`.
    """

    mode: AsyncMode

    def in_processes(self, generators: int, trainers: int) -> bool:
        """Whether the run's generators and trainers are processes of their own
        (:meth:`~scalectl.recipe.async_modes.AsyncMode.in_processes`)."""
        return self.mode.in_processes(generators, trainers)

    def describe(self) -> str:
        """One word for logs: ``sync``, ``ppo_off_policy-8``."""
        return self.mode.describe()

    def batches(self, recipe, policy, state, problems: list, link=None) -> BatchSource:
        """The run's batch source.

        Args:
            policy: the loop's :class:`~scalectl.rl.loop.Policy`; state: its
                :class:`~scalectl.rl.loop.LoopState`; problems: the training prompts.
            link: when the run is in processes (:meth:`in_processes`), the first trainer
                rank's :class:`~scalectl.rl.schedule.feeder.StreamLink` to the generators; None
                when this process generates.

        Raises:
            ValueError: a streaming mode without a link.
        """
        return SOURCES[self.mode.source](self.mode, recipe, policy, state, problems, link)


def schedule_for(async_) -> Schedule:
    """The schedule of a recipe's ``async`` section (``mode``, ``k``): once per job.

    Raises:
        UserError: an unknown mode (names the allowed ones).
    """
    return Schedule(async_mode(async_))


# --------------------------------------------------------------------------- in one process


class LocalBatches:
    """Batches generated by the run's own engine, a round of ``mode.steps_per_round`` at a time
    with the same weights.

    The batches not yet trained are kept in ``state.pending`` (so a checkpoint holds them);
    batch j of a round (generated at step v) is sampled with seed ``seed * 100003 + v + j``
    and trained by version v + j, its tokens checked against the mode's staleness bound.
    """

    def __init__(self, recipe, policy, state, problems: list, mode: AsyncMode):
        self.recipe, self.policy, self.state, self.problems, self.mode = recipe, policy, state, problems, mode

    def next_batch(self, version: int) -> tuple[list, dict]:
        """The next batch of the round, generating a round first when none is left.

        Raises:
            StalenessError: a token more than the mode's staleness bound behind ``version``.
        """
        state = self.state
        if not state.pending:
            state.pending = [generate_batch(self.recipe, self.policy.engine, self.problems, state,
                                            seed=self.recipe.seed * 100003 + state.step + j)
                             for j in range(self.mode.steps_per_round)]
        kept, stats = state.pending.pop(0)
        check_staleness(self.mode, version, kept)
        return kept, stats

    def after_step(self, version: int) -> None:
        pass

    def step_metrics(self, version: int) -> dict:
        return {}

    def checkpoint_fields(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class LaggedBatches(LocalBatches):
    """PipelineRL-k without its timing: the trainer's batch v is sampled whole by policy version
    max(0, v - k), by the run's own engine.

    ``k + 1`` batches are kept generated ahead in ``state.pending`` (so a checkpoint holds them):
    before step v the batches for steps v .. v + k are there, the last one sampled by the weights
    of version v, which made it.  So every batch of step v >= k is exactly k versions old, the
    first k batches (version 0) less; which tokens are trained does not depend on how fast either
    side runs.  Batch b is sampled with seed ``seed * 100003 + b``.
    """

    def __init__(self, recipe, policy, state, problems: list, mode: AsyncMode):
        super().__init__(recipe, policy, state, problems, mode)
        self._versions: list[list[int]] = []

    def next_batch(self, version: int) -> tuple[list, dict]:
        """The batch of step ``version``, after sampling (with the current weights) the batches that
        bring the queue to k + 1.

        Raises:
            StalenessError: a token more than k versions behind ``version``.
        """
        state = self.state
        while len(state.pending) < self.mode.k + 1:
            batch = state.step + len(state.pending)
            state.pending.append(generate_batch(self.recipe, self.policy.engine, self.problems, state,
                                                seed=self.recipe.seed * 100003 + batch))
        kept, stats = state.pending.pop(0)
        self._versions = check_staleness(self.mode, version, kept)
        return kept, stats

    def step_metrics(self, version: int) -> dict:
        """The staleness of the batch just trained (by ``version - 1``): k from step k on."""
        st = staleness_stats(version - 1, self._versions)
        return {"staleness_max": st["staleness_max"], "staleness_mean": st["staleness_mean"]}


# --------------------------------------------------------------------------- the builders


@source("rounds")
def _rounds(mode: AsyncMode, recipe, policy, state, problems: list, link) -> BatchSource:
    """Rounds of ``mode.steps_per_round`` batches with one policy version: generated here without
    a link, by the generator processes behind ``link`` otherwise."""
    if link is None:
        return LocalBatches(recipe, policy, state, problems, mode)
    return RoundFeeder(recipe, state, policy.model, link, mode)


@source("stream")
def _stream(mode: AsyncMode, recipe, policy, state, problems: list, link) -> BatchSource:
    """Groups streamed by the generator processes behind ``link``, weights pushed after every step."""
    if link is None:
        raise ValueError(f"async.mode = {mode.name} needs the trainer's link to its generators")
    return Feeder(recipe, state, policy.model, link, mode)


@source("lagged")
def _lagged(mode: AsyncMode, recipe, policy, state, problems: list, link) -> BatchSource:
    """Batch v sampled here by version max(0, v - k) (``async.schedule = "fixed_lag"``)."""
    if link is not None:
        raise ValueError("async.schedule = fixed_lag samples in the trainer's own process; it has no link")
    return LaggedBatches(recipe, policy, state, problems, mode)
