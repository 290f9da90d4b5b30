"""Who is who in a job in processes, and which task is gone when a connection breaks.

Every task of a job in processes (generators and trainers, :mod:`scalectl.rl.processes.bodies`)
writes a card in the job's rendezvous store as it joins (:class:`Board`): its global
rank, role, rank within the role, pid, host and log file (``$SCALECTL_TASK_LOG``, which
the launcher sets: the Slurm task's log, or the local process's), and then keeps a
heartbeat there (a counter raised every ``interval_s`` seconds by a thread).

When a connection to a peer breaks, the survivor names the task it lost:

* a generator's stream ends: the generator's rank is known, its card says the rest;
* a collective of the trainers fails (gloo only says that *a* peer closed its
  connection): the task whose heartbeat stopped is the one gone (:meth:`Board.gone`).

:class:`TaskLost` then carries a message such as ``trainer task 3 (trainer rank 1, pid
4242 on node7) stopped answering (log: /runs/x/slurm/00/19_3_log.out)``.  It is a
:class:`PeerLost`, so a supervisor that sees the lost task itself
(:func:`scalectl.rl.processes.supervise.supervise`) reports that task and not the survivor.
Without a supervisor (a Slurm job) the first trainer rank records it as the run's error.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass

PREFIX = "scalectl/board"
#: The environment variable holding a task's log file, set by the launcher.
LOG_ENV = "SCALECTL_TASK_LOG"


class PeerLost(RuntimeError):
    """A generator or trainer process stopped answering (its connection closed).  Also
    importable from :mod:`scalectl.rl.transport.stream`, whose flows raise it."""


class TaskLost(PeerLost):
    """A task of the job stopped answering; the message names it, its pid, host and log.

    Attributes:
        card: the lost task's :class:`Card`.
    """

    def __init__(self, card: "Card"):
        super().__init__(card.describe("stopped answering"))
        self.card = card

    def __reduce__(self):           # picklable (submitit stores a task's exception)
        return (TaskLost, (self.card,))

    @property
    def leader(self) -> bool:
        """Whether the lost task is the first trainer rank (the one that records the run)."""
        return self.card.role == "trainer" and self.card.role_rank == 0


def is_lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` only says that another task went away (a generator or the leader stopped
    answering, a trainers' collective whose peer closed its connection)."""
    text = str(exc)
    return isinstance(exc, PeerLost) or "closed by peer" in text or "reset by peer" in text


@dataclass(frozen=True)
class Card:
    """One task as it registered.

    Attributes:
        rank: global rank; role: ``generator`` or ``trainer``; role_rank: rank within the role;
        pid: process id; host: host name; log: its log file ('' when the launcher gave none).
    """

    rank: int
    role: str
    role_rank: int
    pid: int
    host: str
    log: str

    def describe(self, state: str = "") -> str:
        """``trainer task 3 (trainer rank 1, pid 4242 on node7)``, then ``state`` (e.g. ``stopped
        answering``) and `` (log: PATH)`` when the log is known."""
        text = f"{self.role} task {self.rank} ({self.role} rank {self.role_rank}, pid {self.pid} on {self.host})"
        return text + (f" {state}" if state else "") + (f" (log: {self.log})" if self.log else "")


class Board:
    """This task's card and heartbeat in the job's store, and what it can read of the others'.

    Args:
        store: the job's rendezvous store (``torch.distributed.TCPStore`` or a
            ``PrefixStore`` over it: ``set``, ``get``, ``check``).
        task: this task (:class:`scalectl.rl.transport.roles.Task`).
        log: this task's log file (default ``$SCALECTL_TASK_LOG``).
        interval_s: seconds between two heartbeats.
    """

    def __init__(self, store, task, log: str | None = None, interval_s: float = 1.0):
        self.store, self.rank, self.world, self.interval_s = store, task.rank, task.world_size, interval_s
        log = os.environ.get(LOG_ENV, "") if log is None else log
        self.card = Card(task.rank, task.role, task.role_rank, os.getpid(), socket.gethostname(), log)
        self._cards: dict[int, Card] = {}
        store.set(f"{PREFIX}/card/{task.rank}", json.dumps(self.card.__dict__))
        store.set(f"{PREFIX}/beat/{task.rank}", "0")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        n = 0
        while not self._stop.wait(self.interval_s):
            n += 1
            try:
                self.store.set(f"{PREFIX}/beat/{self.rank}", str(n))
            except Exception:  # noqa: BLE001 - the store's host is gone: nothing left to tell
                return

    def close(self) -> None:
        """Stop the heartbeat (the task is leaving on purpose).  Returns once the heartbeat
        thread has ended (or after 5 s plus 10 intervals, when a beat hangs on a store whose
        host is gone), so no beat lands after it: a beat already past its wait would
        otherwise be written late and make the task look alive."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0 + 10 * self.interval_s)

    def card_of(self, rank: int) -> Card | None:
        """The card of task ``rank`` (read once, then kept), or None when it cannot be read."""
        if rank not in self._cards:
            try:
                key = f"{PREFIX}/card/{rank}"
                if not self.store.check([key]):
                    return None
                self._cards[rank] = Card(**json.loads(self.store.get(key)))
            except Exception:  # noqa: BLE001 - the store's host is gone
                return None
        return self._cards[rank]

    def read_cards(self) -> None:
        """Read every task's card now (while the store's host is surely alive)."""
        for rank in range(self.world):
            self.card_of(rank)

    def _beats(self, ranks: list[int]) -> dict[int, bytes]:
        return {r: self.store.get(f"{PREFIX}/beat/{r}") for r in ranks}

    def gone(self, ranks: list[int] | None = None, wait_s: float | None = None) -> list[Card]:
        """The tasks among ``ranks`` (default: every other task) whose heartbeat did not move
        in ``wait_s`` seconds (default 3 heartbeat intervals), in rank order; [] when the
        store cannot be read."""
        ranks = [r for r in (range(self.world) if ranks is None else ranks) if r != self.rank]
        wait_s = 3 * self.interval_s if wait_s is None else wait_s
        try:
            before = self._beats(ranks)
            time.sleep(wait_s)
            after = self._beats(ranks)
        except Exception:  # noqa: BLE001 - the store's host is gone
            return []
        return [c for r in ranks if before[r] == after[r] and (c := self.card_of(r)) is not None]

    def lost(self, exc: BaseException, ranks: list[int] | None = None) -> BaseException:
        """What to raise for ``exc`` when a peer among ``ranks`` may be gone: a :class:`TaskLost`
        naming the first task whose heartbeat stopped, or ``exc`` itself when ``exc`` is not a
        lost connection or no task is seen gone."""
        if not is_lost_peer(exc):
            return exc
        gone = self.gone(ranks)
        if not gone:
            return exc
        return TaskLost(gone[0])

    def lost_rank(self, rank: int, detail: str) -> PeerLost:
        """A :class:`TaskLost` naming task ``rank`` (its connection broke: ``detail``), or a plain
        :class:`PeerLost` with ``detail`` when its card is unknown."""
        card = self.card_of(rank)
        if card is None:
            return PeerLost(detail)
        return TaskLost(card)
