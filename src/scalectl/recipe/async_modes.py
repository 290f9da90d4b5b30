"""The async modes, described once: one small frozen object per ``async.mode``.

An :class:`AsyncMode` says, from the recipe's ``async`` section (``mode``, ``k``), everything
the rest of scalectl needs to know about a mode's arithmetic (v = trainer version, P =
``batch.prompts_per_step``, M generators, N trainers):

* its staleness bound (:attr:`AsyncMode.staleness_bound`): the most policy versions a
  trained token may lag the trainer that trains it (every consumed token is checked
  against it: :func:`scalectl.rl.batches.collect.check_staleness`);
* its rounds (:attr:`AsyncMode.steps_per_round`, :meth:`AsyncMode.round_prompts`): how many
  batches one policy version samples before weights move, and how many prompts that is;
  None for a mode that streams;
* its request window (:meth:`AsyncMode.request_window`): how many prompts (groups of G
  completions) may be requested from the generators and not yet consumed;
* whether a layout of M generators and N trainers runs in processes of their own
  (:meth:`AsyncMode.in_processes`), and which layouts it accepts
  (:meth:`AsyncMode.layout_problems`, the dry run's reasons to refuse one);
* how its batches reach the trainer (:attr:`AsyncMode.source`: ``rounds``, ``stream`` or
  ``lagged``), which picks the batch source in :mod:`scalectl.rl.schedule.modes`.

The modes:

* ``sync``: one batch sampled by version v, one step (k is ignored); staleness 0.
* ``ppo_off_policy`` (k): a round of k batches (k P prompts) sampled by version v, then k
  steps on them; batch j of the round is trained by version v + j, so the importance ratio
  pi_train / pi_gen corrects up to k - 1 versions of staleness.
* ``pipeline`` (PipelineRL-k, Piche et al. 2025, as run by ScaleRL, Khatri et al. 2025,
  arXiv 2510.13786, section 3.1): generator processes stream groups, the trainer pushes
  weights after every step and keeps c_v + (k + 1) P requests issued (c_v groups consumed
  before step v), so every trained token is at most k versions old.  Which version samples
  a token then depends on how fast each side runs (the machine's load among them);
  ``async.schedule = "fixed_lag"`` takes that timing out: each batch is sampled whole by
  the policy exactly k versions behind the trainer that trains it (batch v by version
  max(0, v - k)), in one process on 1 generator + 1 trainer, so a run's curve is the same
  on a quiet machine and a busy one.

``sync``, ``ppo_off_policy`` and the fixed-lag pipeline run in one process on 1 generator + 1
trainer; ``sync`` and ``ppo_off_policy`` run in processes on any other layout; the streaming
pipeline always runs in processes.

This module imports neither torch nor the launchers: the recipe schema builds the allowed
values of ``async.mode`` from :data:`ASYNC_MODES`, and the dry run
(:mod:`scalectl.job.layout`) checks layouts with it.

Adding an async mode touches this file (its :class:`AsyncMode` subclass and its entry in
:data:`ASYNC_MODES`; ``async.mode`` in :mod:`scalectl.recipe.schema` follows the table); a
mode whose batches come neither in rounds nor as a stream also adds its batch source to
:data:`scalectl.rl.schedule.modes.SOURCES` (:mod:`scalectl.rl.schedule.modes`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from scalectl.errors import UserError


@dataclass(frozen=True)
class AsyncMode(ABC):
    """One async mode with its k (the recipe's ``async.k``).

    Attributes:
        k: ``async.k`` (versions; ``sync`` ignores it).
        name: the ``async.mode`` value (class attribute).
        source: ``rounds`` (a round of :attr:`steps_per_round` batches sampled by one policy
            version, weights pushed between rounds) or ``stream`` (generators sample without
            stopping, weights pushed after every step) (class attribute).
    """

    k: int = 1
    name: ClassVar[str] = ""
    source: ClassVar[str] = ""

    @property
    @abstractmethod
    def staleness_bound(self) -> int:
        """The most policy versions a trained token may lag the trainer version that trains it."""

    @property
    def steps_per_round(self) -> int | None:
        """Batches (optimiser steps) sampled by one policy version before the weights move;
        None when the mode streams."""
        return None

    def round_prompts(self, prompts_per_step: int) -> int | None:
        """Prompts one round requests at once (``steps_per_round`` x P); None when the mode streams."""
        steps = self.steps_per_round
        return None if steps is None else steps * prompts_per_step

    @abstractmethod
    def request_window(self, prompts_per_step: int) -> int:
        """Prompts (groups) that may be requested from the generators and not yet consumed, at most
        (dynamic-sampling refills aside)."""

    def in_processes(self, generators: int, trainers: int) -> bool:
        """True when ``generators`` generators and ``trainers`` trainers run as processes of their
        own (one task each in a multi-task job); False when one process generates and trains.
        Default: one process for 1 generator + 1 trainer, processes otherwise."""
        return not (generators == 1 and trainers == 1)

    def layout_problems(self, generators: int, trainers: int, prompts_per_step: int) -> list[str]:
        """Why this mode cannot use ``generators`` generators and ``trainers`` trainers with P =
        ``prompts_per_step`` without leaving some idle (each reason names the keys and what
        would work); empty when it can."""
        return []

    def describe(self) -> str:
        """One word for logs: ``ppo_off_policy-8``."""
        return f"{self.name}-{self.k}"


@dataclass(frozen=True)
class RoundMode(AsyncMode):
    """A mode that samples a round of :attr:`steps_per_round` batches with one policy version, then
    trains one per step: batch j of a round is j versions old when trained."""

    source: ClassVar[str] = "rounds"

    @property
    def staleness_bound(self) -> int:
        return self.steps_per_round - 1

    def request_window(self, prompts_per_step: int) -> int:
        return self.round_prompts(prompts_per_step)

    def round_text(self, prompts_per_step: int) -> str:
        """The round's prompts, with the keys they come from, for messages."""
        raise NotImplementedError

    def layout_problems(self, generators: int, trainers: int, prompts_per_step: int) -> list[str]:
        """In processes, a round's prompts must split into whole groups across the generators,
        else some generators wait while the others sample the last prompts of each round."""
        n = self.round_prompts(prompts_per_step)
        if not self.in_processes(generators, trainers) or n % generators == 0:
            return []
        return [f"{self.round_text(prompts_per_step)} does not split into whole groups across "
                f"hardware.generators = {generators} in async.mode = {self.name}: {generators - n % generators} "
                f"generator(s) would wait while the others sample the last prompts of each round (use a "
                f"number of generators that divides {n})"]


@dataclass(frozen=True)
class Sync(RoundMode):
    """On-policy: one batch sampled by the current weights, one step (staleness 0; k ignored)."""

    name: ClassVar[str] = "sync"

    @property
    def steps_per_round(self) -> int:
        return 1

    def round_text(self, prompts_per_step: int) -> str:
        return f"batch.prompts_per_step = {prompts_per_step}"

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class PPOOffPolicy(RoundMode):
    """k batches sampled by one policy version, then k optimiser steps on them (staleness <= k - 1)."""

    name: ClassVar[str] = "ppo_off_policy"

    @property
    def steps_per_round(self) -> int:
        return self.k

    def round_text(self, prompts_per_step: int) -> str:
        return (f"a round of async.k x batch.prompts_per_step = {self.k} x {prompts_per_step} = "
                f"{self.round_prompts(prompts_per_step)} prompts")


#: The allowed values of ``async.schedule``: ``streaming`` (PipelineRL as timed by the machine)
#: and ``fixed_lag`` (each batch sampled by the policy exactly k versions behind).
PIPELINE_SCHEDULES: tuple[str, ...] = ("streaming", "fixed_lag")


@dataclass(frozen=True)
class Pipeline(AsyncMode):
    """PipelineRL-k: every trained token is at most k versions old.

    With ``schedule = "streaming"`` generators stream, weights are pushed after every step and
    (k + 1) P requests are kept open; always in processes, and which version samples a token
    depends on timing.  With ``schedule = "fixed_lag"`` the trainer's batch v is sampled whole
    by version max(0, v - k), k + 1 batches kept generated ahead, in one process on 1 generator
    + 1 trainer: the same tokens whatever the machine's load.

    Attributes:
        schedule: one of :data:`PIPELINE_SCHEDULES` (``async.schedule``).
    """

    schedule: str = "streaming"
    name: ClassVar[str] = "pipeline"

    @property
    def source(self) -> str:
        return "lagged" if self.schedule == "fixed_lag" else "stream"

    @property
    def staleness_bound(self) -> int:
        return self.k

    def request_window(self, prompts_per_step: int) -> int:
        return (self.k + 1) * prompts_per_step

    def in_processes(self, generators: int, trainers: int) -> bool:
        return self.schedule != "fixed_lag" or not (generators == 1 and trainers == 1)

    def describe(self) -> str:
        return f"{self.name}-{self.k}" + (" (fixed lag)" if self.schedule == "fixed_lag" else "")

    def layout_problems(self, generators: int, trainers: int, prompts_per_step: int) -> list[str]:
        """The fixed-lag schedule runs in one process (1 generator + 1 trainer); the streaming one's
        (k + 1) P prompts kept requested must be at least one per generator."""
        if self.schedule == "fixed_lag":
            if generators == 1 and trainers == 1:
                return []
            return [f"async.schedule = fixed_lag samples and trains in one process: it needs hardware.generators "
                    f"= 1 and hardware.trainers = 1, not {generators} and {trainers} (use async.schedule = "
                    "streaming for this layout)"]
        window = self.request_window(prompts_per_step)
        if window >= generators:
            return []
        return [f"async.mode = pipeline keeps (async.k + 1) x batch.prompts_per_step = "
                f"({self.k} + 1) x {prompts_per_step} = {window} prompts requested at once: "
                f"hardware.generators = {generators} would leave {generators - window} generator(s) without "
                f"work (use at most {window})"]


#: ``async.mode`` -> its class, in the order the schema lists the allowed values.
ASYNC_MODES: dict[str, type[AsyncMode]] = {cls.name: cls for cls in (Sync, PPOOffPolicy, Pipeline)}

#: The allowed values of ``async.mode``.
ASYNC_MODE_NAMES: tuple[str, ...] = tuple(ASYNC_MODES)


def async_mode(section) -> AsyncMode:
    """The :class:`AsyncMode` of a recipe's ``async`` section (anything with ``mode`` and ``k``, and
    for ``pipeline`` optionally ``schedule``).

    Raises:
        UserError: an unknown mode (names the allowed ones).
    """
    try:
        cls = ASYNC_MODES[section.mode]
    except KeyError:
        raise UserError(f"async.mode = {section.mode!r} is not one of: {', '.join(ASYNC_MODES)}") from None
    if cls is Pipeline:
        schedule = getattr(section, "schedule", "streaming")
        if schedule not in PIPELINE_SCHEDULES:
            raise UserError(f"async.schedule = {schedule!r} is not one of: {', '.join(PIPELINE_SCHEDULES)}")
        return cls(section.k, schedule)
    return cls(section.k)
