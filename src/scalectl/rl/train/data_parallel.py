"""N trainer ranks driven by one: the leader takes the loop's steps, the followers follow.

The RL loop runs on the first trainer rank (the *leader*): it receives the
step's kept groups, evaluates, writes points, checkpoint metadata and status.
Every other trainer rank (a *follower*) runs :func:`follow`: it waits for the
leader's next command over the trainers' process group and executes its part:

* ``step``: train on its share of the step's groups (whole groups,
  :func:`scalectl.rl.train.sharding.split_groups`), with the batch-wide advantage
  std, aggregation normalisers and metrics all-reduced
  (:mod:`scalectl.rl.train.sharding`), so the update is the 1-trainer update;
* ``save`` / ``load``: DeepSpeed's checkpoint calls, which every rank makes
  (under ZeRO each saves its partition);
* ``gather``: gather the full parameters (ZeRO-3) while the leader reads them
  (e.g. to push them to the generators), a collective over every rank;
* ``stop``: return.

The leader's :class:`TrainerRanks` sends the commands; with one trainer it is
a plain :class:`~scalectl.rl.train.trainer.PolicyTrainer` step on the whole batch.
Commands travel as pickled objects (``scatter_object_list``) over the
trainers' group (gloo on CPUs, NCCL on GPUs).
"""

from __future__ import annotations

from scalectl.rl.train.batch import build_train_batch
from scalectl.rl.train.sharding import allreduce_sum, split_groups

STEP, SAVE, LOAD, GATHER, STOP = "step", "save", "load", "gather", "stop"


def _scatter(commands: list | None, src: int, group) -> tuple:
    """One command per rank from ``src`` (global rank); returns this rank's."""
    import torch.distributed as dist

    out = [None]
    dist.scatter_object_list(out, commands, src=src, group=group)
    return out[0]


def _execute(trainer, command: tuple, normalization: str, pad_id: int, reduce):
    kind, arg = command
    if kind == STEP:
        return trainer.train_step(build_train_batch(arg, normalization, pad_id, reduce=reduce))
    if kind == SAVE:
        return trainer.save(arg)
    if kind == LOAD:
        return trainer.load(arg)
    if kind == GATHER:
        return trainer.gathered(arg)
    raise ValueError(f"unknown trainer command {kind!r}")


class TrainerRanks:
    """The leader's handle on every trainer rank (itself included).

    Args:
        trainer: this process's :class:`~scalectl.rl.train.trainer.PolicyTrainer`.
        normalization: ``advantage.normalization``.
        pad_id: the tokenizer's padding id.
        group: the trainers' process group (None: the default group, when the
            torch.distributed world is the trainers alone).

    Attributes:
        size: trainer ranks.
        on_lost: ``on_lost(exc)`` -> the exception to raise instead of ``exc`` when a step, save
            or load fails (e.g. :meth:`scalectl.rl.transport.board.Board.lost`, which names a trainer rank
            that is gone); None raises ``exc``.
    """

    def __init__(self, trainer, normalization: str, pad_id: int, group=None):
        import torch.distributed as dist

        self.trainer, self.normalization, self.pad_id, self.group = trainer, normalization, pad_id, group
        self.size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.src = dist.get_global_rank(group, 0) if (group is not None and self.size > 1) else 0
        self.reduce = allreduce_sum(group) if self.size > 1 else None
        self.on_lost = None

    def _all(self, commands: list[tuple], mine: tuple | None = None):
        """Send ``commands`` (one per rank) and execute this rank's (``mine`` instead when given:
        one that is not sent, e.g. holding a function)."""
        try:
            sent = _scatter(commands, self.src, self.group) if self.size > 1 else commands[0]
            mine = sent if mine is None else mine
            return _execute(self.trainer, mine, self.normalization, self.pad_id, self.reduce)
        except RuntimeError as exc:
            if self.size == 1 or self.on_lost is None:
                raise
            instead = self.on_lost(exc)
            if instead is exc:
                raise
            raise instead from exc

    def step(self, groups: list) -> dict:
        """One optimiser step on the step's kept ``groups`` over every trainer rank.

        Returns:
            The step's metrics, the whole batch's (as :meth:`PolicyTrainer.train_step`).

        Raises:
            ValueError: no groups.
        """
        if not groups:
            raise ValueError("no groups to train on")
        if self.size == 1:
            return self._all([(STEP, groups)])
        shares = split_groups(len(groups), self.size)
        return self._all([(STEP, [groups[i] for i in share]) for share in shares])

    def save(self, folder: str) -> None:
        """Every rank saves its engine state under ``folder`` (a shared folder)."""
        self._all([(SAVE, folder)] * self.size)

    def load(self, folder: str) -> None:
        """Every rank loads what :meth:`save` wrote."""
        self._all([(LOAD, folder)] * self.size)

    def gathered(self, fn):
        """``fn(model)`` on this rank with the full parameters: every rank gathers its ZeRO-3
        partitions meanwhile (:meth:`scalectl.rl.train.trainer.PolicyTrainer.gathered`); at other
        stages the parameters are whole already.

        Returns:
            What ``fn`` returns.
        """
        return self._all([(GATHER, None)] * self.size, mine=(GATHER, fn))

    def stop(self) -> None:
        """Release the followers (:func:`follow` returns)."""
        if self.size > 1:
            _scatter([(STOP, None)] * self.size, self.src, self.group)


def follow(trainer, normalization: str, pad_id: int, group=None, src: int = 0) -> int:
    """A follower trainer rank: execute the leader's commands until ``stop``.

    Args:
        trainer: this process's :class:`~scalectl.rl.train.trainer.PolicyTrainer`.
        normalization, pad_id: as :class:`TrainerRanks`.
        group: the trainers' process group.
        src: the leader's global rank.

    Returns:
        The optimiser steps taken.

    Raises:
        RuntimeError: from torch.distributed when the leader is gone.
    """
    reduce = allreduce_sum(group)
    steps = 0
    while True:
        command = _scatter(None, src, group)
        if command[0] == STOP:
            return steps
        _execute(trainer, command, normalization, pad_id, reduce)
        steps += command[0] == STEP
