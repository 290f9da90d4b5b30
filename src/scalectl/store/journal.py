"""Run journals: how a job on another host (or beside a store on a network file system)
records its run without writing the store, and how the store takes them in.

SQLite's WAL index is shared memory on one host and POSIX locks over NFS are unreliable,
so a store on a shared file system written by jobs on several hosts can be corrupted
(:mod:`scalectl.store.filesystem`).  Such a job appends what it would have written (its
evaluation points and its run's status) to a journal in its run folder instead:
``RUN_DIR/journal/<stamp>-<host>-<pid>.jsonl``, one file per process, each written by that
process alone (:mod:`scalectl.job.journal`), one JSON record per line, each line synced to
disk before the job goes on.  Records::

    {"run_id": 3, "seq": 0, "time": "2026-12-01T22:53:45.123456+00:00", "kind": "run",
     "fields": {"status": "running", "started": "..."}}
    {"run_id": 3, "seq": 1, "time": "...", "kind": "point", "point": {"step": 0, "pass_rate": 0.5, ...}}

:func:`ingest`, called whenever a command opens the store (so one host, the one the
commands run on, writes the SQLite file), takes in every record added since the last
ingest: the byte offset read so far of each journal file is kept in the store's
``journal_offsets`` table, in the same transaction as the records it covers, so each record
is applied once however many commands ingest at once or die in between.  Points are stored
by (run, step) as the job would have stored them (a point of a step taken again replaces the
earlier one); run fields (status, started, ended, error) are applied in the order the job
wrote them (records of several files by time).  A last line without its newline is a
record still being written, or torn by a writer killed mid-append: it is left for later
and never applied half; a complete line that is not a record is skipped (and counted).
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from scalectl.points import POINT_FIELDS

JOURNAL_DIR = "journal"
JOURNAL_SUFFIX = ".jsonl"
#: The run fields a journal may set (what the job body records about its run).
RUN_FIELDS = frozenset({"status", "started", "ended", "error", "warm_start"})


def journal_folder(run_dir: str | Path) -> Path:
    """``RUN_DIR/journal``: where a run's journals are."""
    return Path(run_dir) / JOURNAL_DIR


def journal_files(run_dir: str | Path) -> list[Path]:
    """The run's journal files, oldest first (their names start with a UTC time stamp)."""
    try:
        names = sorted(e.name for e in os.scandir(journal_folder(run_dir))
                       if e.name.endswith(JOURNAL_SUFFIX) and e.is_file())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [journal_folder(run_dir) / n for n in names]


def read_records(path: str | Path, offset: int = 0) -> tuple[list[dict], int, int]:
    """The complete records of a journal file from byte ``offset`` on.

    Returns:
        (records in file order, the offset just past the last complete line, how many complete
        lines were not records).  A last line without its newline is not read: the offset stops
        before it.
    """
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    records, bad = [], 0
    for line in data[:end].splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if _valid(record):
            records.append(record)
        else:
            bad += 1
    return records, offset + end, bad


def _valid(record) -> bool:
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), int):
        return False
    if record.get("kind") == "point":
        point = record.get("point")
        return (isinstance(point, dict) and not set(point) - set(POINT_FIELDS)
                and isinstance(point.get("step"), int) and point.get("pass_rate") is not None)
    if record.get("kind") == "run":
        fields = record.get("fields")
        return isinstance(fields, dict) and bool(fields) and not set(fields) - RUN_FIELDS
    return False


def journal_points(run_dir: str | Path, run_id: int) -> list[dict]:
    """Every point the run's journals hold (the last one of each step), by step."""
    by_step: dict[int, dict] = {}
    for path in journal_files(run_dir):
        records, _, _ = read_records(path)
        for r in records:
            if r["kind"] == "point" and r["run_id"] == run_id:
                by_step[r["point"]["step"]] = r["point"]
    return [by_step[s] for s in sorted(by_step)]


@dataclass
class Ingested:
    """What one :func:`ingest` took in.

    Attributes:
        points: point records applied; runs: run-field records applied; skipped: complete
            lines that were not records, or records of another run; files: journal files
            that had something new.
    """

    points: int = 0
    runs: int = 0
    skipped: int = 0
    files: list[str] = field(default_factory=list)


def ingest(store, run_ids: set[int] | None = None) -> Ingested:
    """Take every run's new journal records into ``store`` (an open
    :class:`scalectl.store.database.Store`); a read-only store is left as it is.

    Each run with new records is one transaction: its records and the new offsets of its
    journal files, all or none.  Cheap when nothing is new: one folder listing per run and
    one ``stat`` per journal file.

    Args:
        run_ids: only these runs (default: every run with a run folder).

    Returns:
        What was taken in (:class:`Ingested`).

    Raises:
        UserError: the store is damaged, locked or cannot be written (as its own methods say).
    """
    from scalectl.store.database import _sqlite_problem

    try:
        return _ingest(store, run_ids)
    except sqlite3.Error as exc:
        problem = _sqlite_problem(store.path, exc)
        if problem is None:
            raise
        raise problem from None


def _ingest(store, run_ids: set[int] | None) -> Ingested:
    done = Ingested()
    if getattr(store, "readonly", False) or store.path == ":memory:":
        return done
    rows = store._rows("SELECT id, run_dir FROM runs WHERE run_dir IS NOT NULL AND run_dir != ''")
    offsets: dict[tuple[int, str], int] = {
        (r["run_id"], r["file"]): r["offset"] for r in store._rows("SELECT * FROM journal_offsets")}
    for row in rows:
        if run_ids is not None and row["id"] not in run_ids:
            continue
        files = journal_files(row["run_dir"])
        if any(_size(f) > offsets.get((row["id"], f.name), 0) for f in files):
            try:
                _ingest_run(store, row["id"], files, done)
            except OSError:          # a journal that cannot be read now: nothing of it is taken, try later
                done.skipped += 1
    return done


def with_journals(store):
    """``store`` (just opened) after :func:`ingest`; closed if the ingest raises.

    Raises:
        UserError: as the store's writes do (locked, damaged, full).
    """
    try:
        ingest(store)
    except BaseException:
        store.close()
        raise
    return store


def open_with_journals(path: str | Path, *, create: bool = False):
    """The store at ``path`` (:meth:`scalectl.store.database.Store.open`), with the run journals
    written since the last look taken in (:func:`ingest`): how every reader opens the store.

    Raises:
        UserError: as :meth:`~scalectl.store.database.Store.open` and the store's writes do.
    """
    from scalectl.store.database import Store

    return with_journals(Store.open(path, create=create))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _ingest_run(store, run_id: int, files: list[Path], done: Ingested) -> None:
    from scalectl.store.database import _INSERT_POINT, EVAL_POINT_COLUMNS, RUN_STATES, _point_row

    with store.transaction():        # offsets read again under the write lock: another ingest may have run
        offsets = {r["file"]: r["offset"] for r in store._rows(
            "SELECT file, offset FROM journal_offsets WHERE run_id = ?", [run_id])}
        new, ends = [], {}
        for i, path in enumerate(files):
            start = offsets.get(path.name, 0)
            if _size(path) <= start:
                continue
            records, end, bad = read_records(path, start)
            done.skipped += bad
            ends[path.name] = end
            new += [(r.get("time") or "", i, r.get("seq", 0), r) for r in records]
            done.files.append(str(path))
        for _, _, _, r in sorted(new, key=lambda t: t[:3]):
            if r["run_id"] != run_id:
                done.skipped += 1
            elif r["kind"] == "point":
                row = _point_row(run_id, r["point"], r.get("time") or "")
                store.conn.execute(_INSERT_POINT, tuple(map(row.get, EVAL_POINT_COLUMNS)))
                done.points += 1
            elif r["fields"].get("status", "running") not in RUN_STATES:
                done.skipped += 1
            else:                      # the columns are RUN_FIELDS' (checked by read_records)
                names = sorted(r["fields"])
                store.conn.execute(f"UPDATE runs SET {', '.join(f'{n} = ?' for n in names)} WHERE id = ?",
                                   [r["fields"][n] for n in names] + [run_id])
                done.runs += 1
        store.conn.executemany(
            "INSERT OR REPLACE INTO journal_offsets (run_id, file, offset) VALUES (?, ?, ?)",
            [(run_id, name, end) for name, end in ends.items()])
