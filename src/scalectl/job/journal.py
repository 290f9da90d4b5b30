"""What a job writes about its run: the store itself, or a journal the store takes in.

A job writes its evaluation points and its run's status.  It writes them into the SQLite
store directly (``direct``) only when it runs on the host the store belongs to (the host
whose command created or resumed the run, ``store_host`` in ``job.json``) and the store is
on a local file system.  Anywhere else (a Slurm node, or beside a store on NFS, Lustre,
GPFS, CIFS, ...: :func:`scalectl.store.filesystem.file_system`) it appends them to a journal
in its run folder (``journal``): one file per process (:class:`Journal`), one JSON line per
record, each line written whole and synced to disk before the job goes on; the commands on
the store's host take the journals in (:func:`scalectl.store.journal.ingest`), so the
SQLite file is only ever written from one host.  ``$SCALECTL_STORE_MODE=journal`` asks for
journals everywhere.

:func:`job_store` makes the choice and says why (the job logs it); :class:`JobStore` is
what the job body writes through.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from scalectl.points import EvalPoint
from scalectl.store.database import Store
from scalectl.store.filesystem import file_system
from scalectl.store.journal import JOURNAL_SUFFIX, journal_folder, journal_points

MODE_ENV = "SCALECTL_STORE_MODE"
DIRECT, JOURNAL = "direct", "journal"


def _stamp() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class Journal:
    """This process's journal file in ``RUN_DIR/journal/``: one writer (this process; its
    threads take turns), records appended one line each, ``fsync`` after every line.

    The file is ``<UTC stamp>-<host>-<pid>.jsonl``, opened ``O_APPEND`` on the first record.
    A line is written in one ``write`` call when the kernel takes it whole, else in pieces
    until it is whole; a process killed in between leaves a last line without its newline,
    which readers leave alone (:func:`scalectl.store.journal.read_records`).
    """

    def __init__(self, run_dir: str | Path, run_id: int):
        self.run_id = run_id
        folder = journal_folder(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
        self.path = folder / f"{stamp}-{socket.gethostname()}-{os.getpid()}{JOURNAL_SUFFIX}"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _fsync_folder(folder)                 # the new file's name is on disk too
        self._seq = 0
        self._lock = threading.Lock()

    def append(self, kind: str, **body) -> None:
        """Append one record (``kind`` ``point`` with ``point=``, or ``run`` with ``fields=``),
        synced to disk when this returns."""
        with self._lock:
            line = json.dumps({"run_id": self.run_id, "seq": self._seq, "time": _stamp(), "kind": kind, **body},
                              default=str).encode() + b"\n"
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
            self._seq += 1

    def close(self) -> None:
        """Close the file (records already appended stay)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: (run folder, run id, pid) -> this process's open journal: one file per process and run.
_OPEN: dict[tuple[str, int, int], Journal] = {}
_OPEN_LOCK = threading.Lock()


def journal_for(run_dir: str | Path, run_id: int) -> Journal:
    """This process's journal of run ``run_id`` (opened on first use; a forked or spawned
    process opens its own)."""
    key = (str(Path(run_dir).resolve()), run_id, os.getpid())
    with _OPEN_LOCK:
        if key not in _OPEN:
            _OPEN[key] = Journal(run_dir, run_id)
        return _OPEN[key]


@dataclass(frozen=True)
class StoreSink:
    """The training loop's sink for evaluation points, writing the store at ``db`` directly
    (run ``run_id``).  Picklable (a path and an id), so that a trainer process of its own can
    store its points; each point is written in its own transaction before the loop goes on."""

    db: str
    run_id: int

    def __call__(self, point: EvalPoint) -> None:
        with Store.open(self.db) as store:
            store.add_point(self.run_id, point)


@dataclass(frozen=True)
class JournalSink:
    """The training loop's sink for evaluation points, appending them to the run's journal
    (:func:`journal_for`: the journal of the process that calls it).  Picklable; each point is
    on disk before the loop goes on."""

    run_dir: str
    run_id: int

    def __call__(self, point: EvalPoint) -> None:
        data = point.to_dict() if isinstance(point, EvalPoint) else dict(point)
        journal_for(self.run_dir, self.run_id).append("point", point=data)


def store_mode(job: dict, env: dict | None = None) -> tuple[str, str]:
    """How a job with ``job.json`` contents ``job`` writes its run, and why.

    Returns:
        (``direct`` or ``journal``, a sentence saying why, naming the hosts and the store's
        file system).
    """
    env = os.environ if env is None else env
    db, here, home = job["db"], socket.gethostname(), job.get("store_host")
    fs = file_system(Path(db).parent)
    where = f"the store {db} is on {fs.name}"
    if env.get(MODE_ENV) == JOURNAL:
        return JOURNAL, f"{MODE_ENV}={JOURNAL}; {where}"
    if fs.network:
        return JOURNAL, (f"{where}, a file system shared over the network, which SQLite must not be "
                         "written on from several hosts")
    if home is None:
        return JOURNAL, f"{where}, but job.json does not say which host the store belongs to"
    if home != here:
        return JOURNAL, f"this job runs on {here}, the store belongs to {home} ({where})"
    return DIRECT, f"this job runs on {here}, the store's host, and {where} (a local file system)"


class JobStore:
    """What the job body writes about its run: the store (``direct``) or the run's journal.

    Args:
        job: ``job.json``'s contents (db, run_id, store_host).
        run_dir: the run folder.
    """

    def __init__(self, job: dict, run_dir: str | Path, env: dict | None = None):
        self.db, self.run_id, self.run_dir = job["db"], job["run_id"], str(Path(run_dir).resolve())
        self.mode, self.reason = store_mode(job, env)

    def describe(self) -> str:
        """A log line: the mode, where the records go, and why."""
        if self.mode == DIRECT:
            return f"store: direct writes to {self.db} ({self.reason})"
        return (f"store: journal mode, points and status go to {journal_folder(self.run_dir)}/ and the "
                f"scalectl commands on the store's host take them into the store ({self.reason})")

    @property
    def sink(self):
        """The sink for the training loop's points (:class:`StoreSink` or :class:`JournalSink`)."""
        return StoreSink(self.db, self.run_id) if self.mode == DIRECT else JournalSink(self.run_dir, self.run_id)

    def update_run(self, **fields) -> None:
        """Set run fields (status, started, ended, error)."""
        if self.mode == DIRECT:
            with Store.open(self.db) as store:
                store.update_run(self.run_id, **fields)
        else:
            journal_for(self.run_dir, self.run_id).append("run", fields=fields)

    def points(self, run_id: int | None = None) -> list[dict]:
        """The run's points as this job can see them, by step: the store's (direct), or its
        journals' (journal).  ``run_id``: this job's run (as a simulated run asks for them)."""
        if self.mode == DIRECT:
            with Store.open(self.db) as store:
                return store.points(self.run_id)
        return journal_points(self.run_dir, self.run_id)

    def add_point(self, run_id: int, point: EvalPoint | dict) -> None:
        """Store one point of this job's run (``run_id``), as a simulated run does."""
        self.sink(point)
