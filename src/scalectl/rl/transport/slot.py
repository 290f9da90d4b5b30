"""The generator's end of the weights' flow, as one declared interface.

A generator process holds one weight slot: the CPU engine's
(:class:`scalectl.rl.transport.stream.WeightSlot`, which receives each version into buffers of
its own process) or a vLLM engine's (:class:`scalectl.rl.transport.vllm_worker.WorkerWeightSlot`,
whose engine workers receive and load each version themselves).  The generator's body
(:func:`scalectl.rl.processes.bodies.run_generator`) and its evaluations
(:mod:`scalectl.rl.processes.evaluations`) call only what :class:`BaseWeightSlot` declares, so
both slots subclass it: a method changed on one side alone fails at the class's creation (an
abstract method left unimplemented), in the type checker (an incompatible override), and in
``tests/test_weight_slots.py`` (every signature compared), none of which needs vLLM.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from scalectl.rl.transport.board import JOB_ENDING, PeerLost

#: ``check()``: called about once a second while a wait goes on; returns while the wait may go
#: on and raises (the trainer lost or stuck) to end it.
Check = Callable[[], None]


class BaseWeightSlot(ABC):
    """A generator's end of the weights' flow: loads the trainer's versions into the engine
    between decoding steps, holds a version pushed to be evaluated, and takes the trainer's last
    word (version -1) before the generator exits.

    Attributes:
        loads: versions loaded so far.
        ended: the trainer's last word came.
        hold: the version held for an evaluation (no later one loads until :meth:`release`), or None.
        stats: the last load's :class:`~scalectl.rl.transport.broadcast.BroadcastStats`, or None.
    """

    loads: int
    ended: bool
    hold: int | None

    @property
    @abstractmethod
    def stats(self):
        """The last load's :class:`~scalectl.rl.transport.broadcast.BroadcastStats` (None before one)."""

    @abstractmethod
    def poll(self, wait: bool = False, check: Check | None = None) -> bool:
        """Load the next version if it has arrived whole (with ``wait``, once it has, calling
        ``check()`` every second meanwhile); True if one was loaded.  False at once after the
        trainer's last word, or while a version is held (:attr:`hold`).

        Raises:
            PeerLost: the trainer's connection closed; whatever ``check`` raises.
        """

    def release(self) -> None:
        """The held version's evaluation is done: later versions load again."""
        self.hold = None

    def awaiting(self) -> bool:
        """Whether a version (or the trainer's last word) can still arrive; :meth:`drain` stops
        when it cannot.  True unless the slot knows better."""
        return True

    def drain(self, check: Check | None = None) -> None:
        """Load versions until the trainer's last word (after its stop, before exiting, so that
        no broadcast is left pending); returns at once if the trainer is gone.  A held version is
        released first (nothing is evaluated any more).  ``check()`` is called every second while
        a version is awaited.

        Raises:
            whatever ``check`` raises (the trainer lost or stuck).
        """
        self.hold = None
        try:
            while not self.ended and self.awaiting():
                self.poll(wait=True, check=check)
                self.hold = None
        except JOB_ENDING:         # check()'s verdict (a TaskLost is a PeerLost too): the caller's
            raise
        except PeerLost:           # the trainer's connection closed: nothing more will come
            pass
