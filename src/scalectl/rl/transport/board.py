"""Who is who in a job in processes, and which task is gone when a connection breaks.

Every task of a job in processes (generators and trainers, :mod:`scalectl.rl.processes.bodies`)
writes a card in the job's rendezvous store as it joins (:class:`Board`): its global
rank, role, rank within the role, pid, host and log file (``$SCALECTL_TASK_LOG``, which
the launcher sets: the Slurm task's log, or the local process's), and then keeps a
heartbeat there: a thread writes, every ``interval_s`` seconds, a counter it raises, the
seconds since the task's own loop last marked progress (:meth:`Board.mark`: a generator
marks every decoding step and every turn of its loop, the first trainer rank every turn of its
waits and every step) and the no-progress limit the task holds itself to (:attr:`Board.limit_s`:
the first trainer rank's, derived from its step time; ``-`` when it states none).

Two ways a task can fail its job without its process ending on its own:

* it is **lost**: its connections close (its process or node died), or its heartbeat stops
  moving (a process stopped by a signal, a node cut off without closing its connections);
* it is **stuck**: its heartbeat goes on but its loop marks no progress (a stuck collective, a
  deadlocked engine).  :class:`Watch` tells which task among those a waiting task depends on
  made no progress for a given time, and raises :class:`TaskStuck` (or :class:`TaskLost`).

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
        card: the lost task's :class:`Card`; detail: what was seen (e.g. how long its heartbeat
            has stood still), '' when its connection closed.
    """

    def __init__(self, card: "Card", detail: str = ""):
        super().__init__(card.describe("stopped answering" + (f" ({detail})" if detail else "")))
        self.card, self.detail = card, detail

    def __reduce__(self):           # picklable (submitit stores a task's exception)
        return (TaskLost, (self.card, self.detail))

    @property
    def leader(self) -> bool:
        """Whether the lost task is the first trainer rank (the one that records the run)."""
        return self.card.role == "trainer" and self.card.role_rank == 0


class TaskStuck(RuntimeError):
    """A task of the job made no progress for longer than the run allows while its heartbeat went on
    (its process lives: a stuck collective, a deadlocked engine); the message names it, its pid, host
    and log, and how long it has been still.  Not a :class:`PeerLost`: the task that raises it has
    found the cause, it is not a consequence of another task's failure.

    Attributes:
        card: the stuck task's :class:`Card`; idle_s: seconds since it last marked progress;
        limit_s: the limit it passed (``launcher.stall_timeout_s``, or the one derived from the
        step time).
    """

    def __init__(self, card: "Card", idle_s: float, limit_s: float):
        super().__init__(card.describe(f"made no progress for {idle_s:.0f} s while its heartbeat went on "
                                       f"(limit {limit_s:.0f} s, launcher.stall_timeout_s)"))
        self.card, self.idle_s, self.limit_s = card, idle_s, limit_s

    def __reduce__(self):
        return (TaskStuck, (self.card, self.idle_s, self.limit_s))

    @property
    def leader(self) -> bool:
        """Whether the stuck task is the first trainer rank."""
        return self.card.role == "trainer" and self.card.role_rank == 0


#: The errors after which a job in processes cannot go on: a task lost or stuck (the launcher
#: ends the job's other tasks, :class:`scalectl.launch.slurm.SlurmRunJob`).
JOB_ENDING = (TaskLost, TaskStuck)


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
        clock: monotonic seconds, for the time since the last progress (a test may give its own).
    """

    def __init__(self, store, task, log: str | None = None, interval_s: float = 1.0, clock=time.monotonic):
        self.store, self.rank, self.world, self.interval_s = store, task.rank, task.world_size, interval_s
        self.clock = clock
        log = os.environ.get(LOG_ENV, "") if log is None else log
        self.card = Card(task.rank, task.role, task.role_rank, os.getpid(), socket.gethostname(), log)
        self._cards: dict[int, Card] = {}
        self._progress_at = clock()
        #: The no-progress limit this task holds itself to (seconds), published with every beat for
        #: the tasks that wait on it (:class:`Watch` with ``stated``); None: it states none.
        self.limit_s: float | None = None
        store.set(f"{PREFIX}/card/{task.rank}", json.dumps(self.card.__dict__))
        store.set(f"{PREFIX}/beat/{task.rank}", "0 0.0 -")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._thread.start()

    def mark(self) -> None:
        """This task made progress now (its loop turned, a decoding step ran): the next beats say
        how long ago (cheap: no store traffic)."""
        self._progress_at = self.clock()

    def _beat(self) -> None:
        n = 0
        while not self._stop.wait(self.interval_s):
            n += 1
            try:
                limit = "-" if self.limit_s is None else f"{self.limit_s:.1f}"
                self.store.set(f"{PREFIX}/beat/{self.rank}", f"{n} {self.clock() - self._progress_at:.1f} {limit}")
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

    def known_card(self, rank: int) -> Card | None:
        """The card of task ``rank`` if already read (no store traffic: the store's host may be the
        task that stopped answering)."""
        return self._cards.get(rank)

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

    def beats(self, ranks: list[int]) -> dict[int, tuple[int, float, float | None]]:
        """Each task's last beat: (heartbeat counter, seconds since it last marked progress, the
        no-progress limit it states in seconds or None).

        Raises:
            Exception: from the store (its host is gone).
        """
        out = {}
        for r in ranks:
            counter, idle, limit, *_ = self.store.get(f"{PREFIX}/beat/{r}").decode().split() + ["0.0", "-"]
            out[r] = (int(counter), float(idle), None if limit == "-" else float(limit))
        return out

    def _beats(self, ranks: list[int]) -> dict[int, int]:
        return {r: beat[0] for r, beat in self.beats(ranks).items()}

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


class Watch:
    """Which of the tasks ``ranks`` made no progress for ``limit_s`` seconds, read from their beats.

    A task waiting on others (the first trainer rank waiting for rollouts, or for every generator to
    take its weights; a generator waiting on the trainer) calls :meth:`check` while it waits; at
    most every ``every_s`` seconds it reads their beats (:meth:`Board.beats`).  A task whose
    heartbeat counter has stood still for ``limit_s`` seconds (since this watch first saw it) is
    lost (its process stopped by a signal, or its node cut off); one whose counter moves but whose
    loop marked no progress for ``limit_s`` seconds is stuck.  The store is read in a thread, waited
    for at most ``read_s`` seconds (a read of a store whose host is stopped never returns); when the
    store has not answered for ``limit_s`` seconds, its host, task 0, is lost (named by its card, read
    before: :meth:`Board.read_cards`).  A store that cannot be read concludes nothing before then (its
    host is gone: the broken connections say who).

    Args:
        board: the waiting task's :class:`Board`.
        ranks: the tasks it waits on.
        every_s: seconds between two readings.
        clock: monotonic seconds (a test may give its own).
        stated: judge a task stuck only against the limit it states itself
            (:attr:`Board.limit_s`; the larger of it and ``limit_s``), and never while it states none:
            for a generator watching the trainer, whose steps (training, evaluation, checkpoint)
            mark no progress inside and whose limit follows its step time.
    """

    def __init__(self, board: Board, ranks: list[int], every_s: float = 2.0, clock=time.monotonic,
                 stated: bool = False, read_s: float = 5.0):
        self.board, self.ranks, self.every_s, self.clock = board, list(ranks), every_s, clock
        self.stated, self.read_s = stated, read_s
        self._reading: threading.Thread | None = None     # a read still blocked on the store
        self._unread_since: float | None = None
        self._moved: dict[int, tuple[int, float]] = {}    # rank -> (counter, when it last moved)
        self._read_at: float | None = None

    def _read(self) -> dict | None:
        """The watched tasks' beats, or None when the store did not answer within ``read_s``
        seconds (or failed, or a read is still pending)."""
        if self._reading is not None and self._reading.is_alive():
            return None
        box: dict = {}

        def run() -> None:
            try:
                box["beats"] = self.board.beats(self.ranks)
            except Exception:  # noqa: BLE001 - the store's host is gone
                pass
        self._reading = threading.Thread(target=run, name="watch-read", daemon=True)
        self._reading.start()
        self._reading.join(self.read_s)
        return box.get("beats")

    def check(self, limit_s: float) -> None:
        """Raise for the first task found lost, else the stillest task found stuck; return otherwise.

        Raises:
            TaskLost: a task's heartbeat stood still for ``limit_s`` seconds, or the store's host
                (task 0) did not answer for ``limit_s`` seconds.
            TaskStuck: a task marked no progress for ``limit_s`` seconds, its heartbeat going on.
        """
        now = self.clock()
        if self._read_at is not None and now - self._read_at < self.every_s:
            return
        self._read_at = now
        beats = self._read()
        if beats is None:
            now = self.clock()
            self._unread_since = self._unread_since if self._unread_since is not None else now
            host = self.board.known_card(0)
            if host is not None and now - self._unread_since >= limit_s:
                raise TaskLost(host, f"the job's store, which it hosts, did not answer for "
                                     f"{now - self._unread_since:.0f} s, limit {limit_s:.0f} s, "
                                     "launcher.stall_timeout_s: its process is stopped or its node cut off")
            return
        self._unread_since = None
        stuck = []
        for rank, (counter, idle, stated) in beats.items():
            seen = self._moved.get(rank)
            if seen is None or seen[0] != counter:
                self._moved[rank] = seen = (counter, now)
            card = self.board.card_of(rank)
            if card is None:
                continue
            if now - seen[1] >= limit_s:
                raise TaskLost(card, f"its heartbeat stood still for {now - seen[1]:.0f} s, limit {limit_s:.0f} s, "
                                     "launcher.stall_timeout_s: its process is stopped or its node cut off")
            limit = (None if stated is None else max(limit_s, stated)) if self.stated else limit_s
            if limit is not None and idle >= limit:
                stuck.append((idle, card, limit))
        if stuck:
            idle, card, limit = max(stuck, key=lambda x: x[0])
            raise TaskStuck(card, idle, limit)
