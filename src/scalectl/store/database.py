"""The store: one SQLite file holding runs, their evaluation points and fits.

Created, migrated and written through sqlite-utils; read through the standard
library's ``sqlite3`` (importing sqlite-utils costs a fifth of a second, which
read-only commands such as ``scalectl runs`` do not pay), and evaluation points
are inserted with one prepared ``executemany`` per call.  WAL journal and a busy timeout let several jobs
on this host write to one file at once (jobs on other hosts, or beside a store on a network file
system, append to run journals instead, which the commands take in: :mod:`scalectl.store.journal`);
every write is one transaction, so a writer killed
mid-way leaves the file readable and holding none of its partial work.  One
point per (run, step): a point sent again for the same step replaces the old
one, never duplicates it.

Opening is careful about what the path holds: a folder, a device, a file that
is not SQLite or another program's database is refused; a missing store is
created only by the commands that write (``open(create=False)`` for the
others, so a typo in ``--db`` never leaves an empty store behind); a store
whose file or folder cannot be written is opened read-only (readers work,
writers get a clear error); a damaged file (SQLite's "malformed") is refused
before any write, and a read that meets damage says so.  Every such problem
is a :class:`~scalectl.errors.UserError` naming the file.

Tables (schema version :data:`SCHEMA_VERSION`, migrations in :data:`MIGRATIONS`):

* ``runs``: id, name, recipe_hash, seed, recipe (normalised recipe+setup as
  JSON), launcher, job_ids (JSON list), hardware, status, created, started,
  ended, run_dir, source ("scalectl" or "import"), error.
* ``eval_points``: run_id, step, gpu_hours (GPU-hours, "device-hours" on CPU),
  flops, tokens, samples, pass_rate (mean@k), samples_per_prompt (k),
  correct_counts (JSON list of per-prompt correct counts, for pass@k),
  truncation_rate, mean_length (tokens), train_reward, entropy,
  logprob_mismatch (mean |log pi_train - log pi_gen|), retired_prompts,
  wall_seconds, checker_errors, time (ISO 8601).
* ``fits``: run_id, key (axis/method/window), fit (JSON), points_digest, created.
* ``ablation_stages`` (version 2): one row per (ablation, stage, variant) of an
  adaptive ablation: budget (steps per run), seeds, A with its interval, dA
  with its interval, flags (JSON), action (stop, extend, seed, hold), verdict,
  reason, next_budget, next_seeds, spent_hours (device-hours spent by the
  ablation up to this stage), fit (JSON), created.
* ``journal_offsets`` (version 3): run_id, file (a journal file's name in the run's
  ``journal/`` folder), offset (bytes taken in so far): how far each run journal has been
  ingested (:mod:`scalectl.store.journal`).
* ``series_points`` (version 4): evaluations of a run's checkpoints taken after the fact
  (``scalectl evaluate``), one row per (run, series, step): the ``eval_points`` columns, the
  series' name, its ``source`` (the prompt set: a file, or the run's own held-out split) and
  ``prompts`` (how many it held).  A store of an older version gains the table, empty, when
  a command that writes opens it; nothing else changes.
* version 5: ``eval_points`` and ``series_points`` gain ``checker_errors`` (held-out
  completions the answer checker could not judge; empty in the rows of older stores).
* version 6: ``runs`` gains ``warm_start`` (JSON: the checkpoint a run started from, its source
  (shipped, trained or a checkpoint folder), the weights' SHA-256, the warm start's SFT steps
  and check pass rate: :func:`scalectl.rl.train.warmstart.warm_start_record`; empty for runs of
  older stores and imports).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
import stat
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from scalectl.errors import UserError
from scalectl.points import POINT_FIELDS, EvalPoint

if TYPE_CHECKING:
    import sqlite_utils

SCHEMA_VERSION = 6
DEFAULT_DB = "scalectl.db"
RUN_STATES = ("created", "pending", "running", "completed", "failed", "cancelled", "timed_out")

#: The ``eval_points`` columns: the fields of :class:`scalectl.points.EvalPoint`, its run and the time.
EVAL_POINT_COLUMNS: dict[str, type] = {"run_id": int, **POINT_FIELDS, "time": str}
#: The ``series_points`` columns: a point's, with the series it belongs to, its prompt set and size.
SERIES_POINT_COLUMNS: dict[str, type] = {"run_id": int, "series": str, "source": str, "prompts": int,
                                         **POINT_FIELDS, "time": str}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def default_db_path() -> str:
    """``$SCALECTL_DB`` if set, else ``./scalectl.db``."""
    return os.environ.get("SCALECTL_DB", DEFAULT_DB)


def _migrate_1(db: "sqlite_utils.Database") -> None:
    db["runs"].create({
        "id": int, "name": str, "recipe_hash": str, "seed": int, "recipe": str,
        "launcher": str, "job_ids": str, "hardware": str, "status": str,
        "created": str, "started": str, "ended": str, "run_dir": str,
        "source": str, "error": str,
    }, pk="id", not_null={"name", "status"}, defaults={"status": "created", "job_ids": "[]"})
    db["runs"].create_index(["name"], unique=True)
    db["runs"].create_index(["recipe_hash"])
    db["eval_points"].create(EVAL_POINT_COLUMNS, pk=("run_id", "step"),
                             foreign_keys=[("run_id", "runs", "id")])
    db["fits"].create({"run_id": int, "key": str, "fit": str, "points_digest": str,
                       "created": str}, pk=("run_id", "key"),
                      foreign_keys=[("run_id", "runs", "id")])


STAGE_COLUMNS: dict[str, type] = {
    "ablation": str, "stage": int, "variant": str, "is_base": int, "budget": int, "seeds": int,
    "A": float, "A_lo": float, "A_hi": float, "dA": float, "dA_lo": float, "dA_hi": float,
    "flags": str, "action": str, "verdict": str, "reason": str, "next_budget": int,
    "next_seeds": int, "seed_sd": float, "trained_steps": int, "spent_hours": float,
    "fit": str, "created": str,
}


def _migrate_2(db: "sqlite_utils.Database") -> None:
    db["ablation_stages"].create(STAGE_COLUMNS, pk=("ablation", "stage", "variant"))


def _migrate_3(db: "sqlite_utils.Database") -> None:
    db["journal_offsets"].create({"run_id": int, "file": str, "offset": int}, pk=("run_id", "file"),
                                 foreign_keys=[("run_id", "runs", "id")])


def _migrate_4(db: "sqlite_utils.Database") -> None:
    db["series_points"].create(SERIES_POINT_COLUMNS, pk=("run_id", "series", "step"),
                               foreign_keys=[("run_id", "runs", "id")])


def _migrate_5(db: "sqlite_utils.Database") -> None:
    for table in ("eval_points", "series_points"):       # made by an earlier migration of this release: has it
        if "checker_errors" not in db[table].columns_dict:
            db[table].add_column("checker_errors", int)


def _migrate_6(db: "sqlite_utils.Database") -> None:
    if "warm_start" not in db["runs"].columns_dict:
        db["runs"].add_column("warm_start", str)


#: Migration i+1 brings a store from schema version i to i+1.
MIGRATIONS = [_migrate_1, _migrate_2, _migrate_3, _migrate_4, _migrate_5, _migrate_6]
#: The tables a scalectl store holds (another program's SQLite file holds others).
TABLES = frozenset({"runs", "eval_points", "fits", "ablation_stages", "journal_offsets", "series_points"})
#: The tables whose rows belong to one run (``run_id``): what :meth:`Store.delete_run` removes with it.
RUN_TABLES = ("eval_points", "series_points", "fits", "journal_offsets")

_READONLY = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")
_DAMAGED = ("SQLITE_CORRUPT",)


def _sqlite_problem(path: str, exc: sqlite3.Error) -> UserError | None:
    """A user-facing error for what SQLite reports about the file, or None for a bug."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(_READONLY):
        return UserError(f"{path}: the store is read-only (its file or folder cannot be written): {exc}")
    if name.startswith("SQLITE_NOTADB") or "not a database" in str(exc):
        return UserError(f"{path}: not a SQLite database, so not a scalectl store ({exc})")
    if name.startswith(_DAMAGED) or "malformed" in str(exc):
        return UserError(f"{path}: the store is damaged ({exc}); nothing was written. Recover what is "
                         f"readable with `sqlite3 {path} .recover | sqlite3 recovered.db`")
    if name.startswith("SQLITE_FULL"):
        return UserError(f"{path}: the disk is full: {exc}")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return UserError(f"{path}: the store stayed locked by another process: {exc}")
    if name.startswith("SQLITE_IOERR"):
        return UserError(f"{path}: the store cannot be read or written ({exc})")
    return None


def _user_errors(method):
    """Store methods raise UserError (naming the file) for what the file or disk causes."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            problem = _sqlite_problem(self.path, exc)
            if problem is None:
                raise
            raise problem from None

    return wrapper


def _check_path(path: str, create: bool) -> bool:
    """Check what ``path`` holds before SQLite opens it; True when the file exists.

    Raises:
        UserError: a folder or other non-file, a missing store when not ``create``,
            a folder that cannot be made.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise UserError(f"{path}: cannot open the store ({exc.strerror})") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise UserError(f"{path}: is a folder, not a store file (e.g. --db {Path(path) / DEFAULT_DB})")
    if mode is not None and not stat.S_ISREG(mode):
        raise UserError(f"{path}: not a regular file, so not a scalectl store")
    if mode is None:
        if not create:
            raise UserError(f"{path}: no store there (`scalectl run` or `scalectl import` creates one; "
                            "--db or $SCALECTL_DB name another)")
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{path}: cannot create the store's folder ({exc.strerror})") from None
    return mode is not None




class Store:
    """A scalectl SQLite store.  Open with :meth:`open`; methods are safe to
    call from several processes writing to the same file."""

    def __init__(self, conn: sqlite3.Connection, path: str, readonly: bool = False):
        self.conn = conn
        self.path = path
        #: Opened read-only (file or folder not writable): writes raise UserError.
        self.readonly = readonly
        self._checked = False
        self._db: "sqlite_utils.Database | None" = None

    @property
    def db(self) -> "sqlite_utils.Database":
        """The sqlite-utils view of the connection, imported on first use (writes only)."""
        if self._db is None:
            import sqlite_utils

            self._db = sqlite_utils.Database(self.conn)
        return self._db

    def _rows(self, sql: str, args: Iterable = ()) -> list[dict]:
        cur = self.conn.execute(sql, tuple(args))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | os.PathLike | None = None, *, create: bool = True,
             busy_timeout_ms: int = 30000) -> "Store":
        """Open (creating and migrating if needed and ``create``) the store at ``path``.

        A store whose folder cannot be written (SQLite cannot make its ``-wal``
        and ``-shm`` files there) is opened read-only and immutable: it is read
        as the file holds it.

        Args:
            path: the SQLite file; default :func:`default_db_path`.
            create: make the file (and its folder) when missing; reading
                commands pass False and never leave a store behind.
            busy_timeout_ms: how long a write waits for another writer's lock.

        Raises:
            UserError: a folder or non-regular file, a missing store (not
                ``create``), a file that is not a SQLite database or holds
                another program's tables, a damaged file, or one written by a
                newer scalectl (schema version above :data:`SCHEMA_VERSION`).
        """
        path = str(path or default_db_path())
        existed = _check_path(path, create) if path != ":memory:" else False
        try:
            conn = _connect(path, busy_timeout_ms)
            # a file we may not write (its folder we may): SQLite reads it, writes would fail late
            readonly = existed and not os.access(path, os.W_OK)
        except sqlite3.Error as exc:
            name = getattr(exc, "sqlite_errorname", "") or ""
            if not (existed and name.startswith(_READONLY)):
                problem = _sqlite_problem(path, exc)
                raise (problem or UserError(f"{path}: not a scalectl store ({exc})")) from None
            try:                                  # a folder we cannot write: read the file as it is
                conn, readonly = _connect(path, busy_timeout_ms, immutable=True), True
            except sqlite3.Error as exc2:
                raise UserError(f"{path}: cannot open the store read-only ({exc2})") from None
        store = cls(conn, path, readonly)
        try:
            store._check_ours()
            if not readonly:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            store._migrate()
        except sqlite3.Error as exc:
            conn.close()
            raise (_sqlite_problem(path, exc) or UserError(f"{path}: not a scalectl store ({exc})")) from None
        except BaseException:
            conn.close()
            raise
        return store

    def _check_ours(self) -> None:
        """Refuse another program's SQLite file before changing anything in it (not even
        its journal mode): schema version 0 with tables that are not a store's.

        Raises:
            UserError: naming the foreign tables.
        """
        conn = self.conn
        if conn.execute("PRAGMA user_version").fetchone()[0] != 0:
            return
        tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
        if tables - TABLES:
            raise UserError(f"{self.path}: not a scalectl store (a SQLite file of another program, "
                            f"with table(s) {', '.join(sorted(tables - TABLES)[:5])}); give another --db")

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @_user_errors
    def _migrate(self) -> None:
        conn = self.conn
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise UserError(f"{self.path}: store schema version {version} is newer than this "
                            f"scalectl understands ({SCHEMA_VERSION}); upgrade scalectl")
        if version == SCHEMA_VERSION:
            return
        if self.readonly and version > 0:
            return                 # an older store that cannot be written: read as it is (no series)
        if self.readonly:
            raise UserError(f"{self.path}: the store is read-only and empty (its file or folder "
                            "cannot be written)")
        self._check_integrity()
        conn.execute("BEGIN IMMEDIATE")
        try:
            # re-read under the write lock: another process may have migrated meanwhile
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for i in range(version, SCHEMA_VERSION):
                MIGRATIONS[i](self.db)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def transaction(self):
        """A write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``), rolled back on error.

        The first write of this connection checks the file (``PRAGMA
        quick_check``): nothing is ever written into a damaged store.

        Raises:
            UserError: the store is read-only or damaged, or stays locked.
        """
        return _Transaction(self)

    def _check_integrity(self) -> None:
        """``PRAGMA quick_check`` once per connection, before the first write.

        Raises:
            UserError: the store is read-only or damaged.
        """
        if self.readonly:
            raise UserError(f"{self.path}: the store is read-only (its file or folder cannot be written)")
        if self._checked or self.path == ":memory:":
            return
        try:
            result = [r[0] for r in self.conn.execute("PRAGMA quick_check(3)")]
        except sqlite3.Error as exc:
            raise _sqlite_problem(self.path, exc) or exc from None
        if result != ["ok"]:
            raise UserError(f"{self.path}: the store is damaged ({'; '.join(result)}); nothing was written. "
                            f"Recover what is readable with `sqlite3 {self.path} .recover | sqlite3 recovered.db`")
        self._checked = True


    # ------------------------------------------------------------------ runs
    @_user_errors
    def create_run(self, name: str, *, recipe: dict | None = None, recipe_hash: str | None = None,
                   seed: int | None = None, launcher: str = "local", hardware: str = "",
                   run_dir: str = "", source: str = "scalectl", status: str = "created") -> int:
        """Insert a run and return its id.

        Raises:
            UserError: a run with this name exists already.
        """
        row = {"name": name, "recipe": json.dumps(recipe or {}, sort_keys=True),
               "recipe_hash": recipe_hash, "seed": seed, "launcher": launcher,
               "hardware": hardware, "status": status, "created": _now(), "run_dir": run_dir,
               "source": source, "job_ids": "[]"}
        try:
            with self.transaction():
                return self.db["runs"].insert(row).last_pk
        except sqlite3.IntegrityError:
            raise UserError(f"a run named {name!r} exists already in {self.path}") from None

    @_user_errors
    def get_run(self, ref: str | int) -> dict:
        """A run by id or name, with ``recipe`` and ``job_ids`` decoded.

        Raises:
            UserError: no such run.
        """
        rows = []
        if isinstance(ref, int) or str(ref).isdigit():
            rows = self._rows("SELECT * FROM runs WHERE id = ?", [int(ref)])
        if not rows:
            rows = self._rows("SELECT * FROM runs WHERE name = ?", [str(ref)])
        if not rows:
            raise UserError(f"no run {ref!r} in {self.path} (see `scalectl runs`)")
        return _decode_run(rows[0])

    @_user_errors
    def find_runs(self, *, recipe_hash: str | None = None, name_prefix: str | None = None) -> list[dict]:
        """Runs matching a recipe hash and/or a name prefix, oldest first."""
        where, args = [], []
        if recipe_hash is not None:
            where.append("recipe_hash = ?")
            args.append(recipe_hash)
        if name_prefix is not None:
            where.append("name LIKE ? ESCAPE '\\'")
            args.append(name_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self._rows(f"SELECT * FROM runs {clause}ORDER BY id", args)
        return [_decode_run(r) for r in rows]

    @_user_errors
    def list_runs(self) -> list[dict]:
        """Every run, oldest first, with its number of points and last point."""
        sql = """
        SELECT r.*, COUNT(p.step) AS n_points, MAX(p.step) AS last_step,
               (SELECT pass_rate FROM eval_points q WHERE q.run_id = r.id ORDER BY step DESC LIMIT 1) AS last_pass_rate,
               (SELECT truncation_rate FROM eval_points q WHERE q.run_id = r.id ORDER BY step DESC LIMIT 1) AS last_truncation_rate,
               (SELECT gpu_hours FROM eval_points q WHERE q.run_id = r.id ORDER BY step DESC LIMIT 1) AS last_gpu_hours
        FROM runs r LEFT JOIN eval_points p ON p.run_id = r.id GROUP BY r.id ORDER BY r.id"""
        return [_decode_run(r) for r in self._rows(sql)]

    @_user_errors
    def delete_run(self, run_id: int) -> dict[str, int]:
        """Remove a run and every row that belongs to it (:data:`RUN_TABLES`), in one transaction.

        Returns:
            Rows removed, by table (``runs``: 1).

        Raises:
            UserError: no such run, a read-only or damaged store.
        """
        self.get_run(run_id)
        removed = {}
        with self.transaction():
            for table in RUN_TABLES:
                if table == "series_points" and not self._has_series():
                    continue
                removed[table] = self.conn.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id]).rowcount
            removed["runs"] = self.conn.execute("DELETE FROM runs WHERE id = ?", [run_id]).rowcount
        return removed

    @_user_errors
    def update_run(self, run_id: int, **fields: Any) -> None:
        """Set fields of a run (``status`` must be one of :data:`RUN_STATES`).

        Raises:
            ValueError: an unknown status.
        """
        if "status" in fields and fields["status"] not in RUN_STATES:
            raise ValueError(f"status {fields['status']!r} is not one of {RUN_STATES}")
        for key in JSON_RUN_FIELDS:
            if key in fields and not isinstance(fields[key], str):
                fields[key] = json.dumps(fields[key])
        with self.transaction():
            self.db["runs"].update(run_id, fields)

    @_user_errors
    def add_job_id(self, run_id: int, job_id: str) -> None:
        """Append a launcher job id to a run (a requeued job keeps its id once)."""
        with self.transaction():
            row = self.db["runs"].get(run_id)
            ids = json.loads(row["job_ids"] or "[]")
            if job_id not in ids:
                ids.append(job_id)
            self.db["runs"].update(run_id, {"job_ids": json.dumps(ids)})

    # ------------------------------------------------------------------ points
    def add_point(self, run_id: int, point: EvalPoint | dict) -> None:
        """Store one evaluation point; a point for an existing (run, step) replaces it.

        ``point`` keys are those of :data:`EVAL_POINT_COLUMNS` (``run_id`` and
        ``time`` are filled in); ``correct_counts`` may be a list.

        Raises:
            ValueError: an unknown key, or a missing step / pass_rate.
        """
        self.add_points(run_id, [point])

    @_user_errors
    def add_points(self, run_id: int, points: Iterable[EvalPoint | dict]) -> int:
        """Store many points in one transaction (all or none); returns how many.

        One prepared ``INSERT OR REPLACE`` over every column of
        :data:`EVAL_POINT_COLUMNS`, run by ``executemany`` (a key a point
        leaves out is stored as NULL).

        Raises:
            ValueError: as :meth:`add_point`, before anything is written.
        """
        now = _now()
        rows = [tuple(map(_point_row(run_id, p, now).get, EVAL_POINT_COLUMNS)) for p in points]
        with self.transaction():
            self.conn.executemany(_INSERT_POINT, rows)
        return len(rows)

    def _has_series(self) -> bool:
        """Whether the file holds ``series_points`` (a read-only store of version 3 does not)."""
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                                 "name = 'series_points'").fetchone() is not None

    def _point_rows(self, run_id: int, series: str | None) -> list[dict]:
        if series is None:
            return self._rows("SELECT * FROM eval_points WHERE run_id = ? ORDER BY step", [run_id])
        if not self._has_series():
            return []
        return self._rows("SELECT * FROM series_points WHERE run_id = ? AND series = ? ORDER BY step",
                          [run_id, series])

    @_user_errors
    def points(self, run_id: int, series: str | None = None) -> list[dict]:
        """A run's points ordered by step, ``correct_counts`` decoded to a list: its validation
        points (``eval_points``), or with ``series`` the points of that evaluation series
        (``series_points``, with their ``series``, ``source`` and ``prompts``)."""
        out = []
        for r in self._point_rows(run_id, series):
            if r.get("correct_counts"):
                r["correct_counts"] = json.loads(r["correct_counts"])
            out.append(r)
        return out

    @_user_errors
    def point_values(self, run_id: int, columns: Sequence[str], *, zero: str | None = None,
                     series: str | None = None) -> list[tuple]:
        """The values of ``columns`` (of :data:`EVAL_POINT_COLUMNS`) of a run's points ordered by
        step, one tuple each: its validation points, or with ``series`` those of that evaluation
        series (none in a store without ``series_points``); with ``zero``, only the points where
        that column is 0.  A narrow read for long runs: :meth:`points` builds a dict of every
        column for every point.

        Raises:
            ValueError: a column that is not one of :data:`EVAL_POINT_COLUMNS`.
        """
        bad = [c for c in (*columns, *([zero] if zero else [])) if c not in EVAL_POINT_COLUMNS]
        if bad:
            raise ValueError(f"unknown point column(s) {bad}; known: {', '.join(EVAL_POINT_COLUMNS)}")
        if series is not None and not self._has_series():
            return []
        table, args = ("eval_points", [run_id]) if series is None else ("series_points", [run_id, series])
        where = (" AND series = ?" if series is not None else "") + (f" AND {zero} = 0" if zero else "")
        sql = f"SELECT {', '.join(columns)} FROM {table} WHERE run_id = ?{where} ORDER BY step"
        return self.conn.execute(sql, args).fetchall()

    @_user_errors
    def points_digest(self, run_id: int, series: str | None = None) -> str:
        """A digest of a run's points (or of one evaluation series' points): changes whenever any
        point changes.  The column names, then every column of every point in step order as
        JSON, in blocks of 10,000 points."""
        if series is not None and not self._has_series():
            return hashlib.sha256(b"no series").hexdigest()[:16]
        if series is None:
            cur = self.conn.execute("SELECT * FROM eval_points WHERE run_id = ? ORDER BY step", (run_id,))
        else:
            cur = self.conn.execute("SELECT * FROM series_points WHERE run_id = ? AND series = ? ORDER BY step",
                                    (run_id, series))
        h = hashlib.sha256(json.dumps([d[0] for d in cur.description]).encode())
        while rows := cur.fetchmany(10_000):       # blocks of points: memory bounded for any run
            h.update(json.dumps(rows, default=str, separators=(",", ":")).encode())
        return h.hexdigest()[:16]

    @_user_errors
    def add_series_points(self, run_id: int, series: str, source: str, prompts: int,
                          points: Iterable[EvalPoint | dict]) -> int:
        """Store points of the evaluation series ``series`` of a run in one transaction (all or
        none); a point for an existing (run, series, step) replaces it.  Returns how many.

        Args:
            source: the prompt set the series evaluates (a file's path, or the run's held-out split).
            prompts: how many prompts it held.

        Raises:
            ValueError: as :meth:`add_point`, an empty series name, before anything is written.
            UserError: no such run.
        """
        if not series:
            raise ValueError("an evaluation series needs a name")
        self.get_run(run_id)
        now = _now()
        rows = []
        for p in points:
            row = _point_row(run_id, p, now) | {"series": series, "source": source, "prompts": int(prompts)}
            rows.append(tuple(map(row.get, SERIES_POINT_COLUMNS)))
        with self.transaction():
            self.conn.executemany(_INSERT_SERIES_POINT, rows)
        return len(rows)

    @_user_errors
    def series(self, run_id: int) -> list[dict]:
        """A run's evaluation series: name, source, prompts, samples_per_prompt (of the last
        point), points (how many) and steps (first and last), by name."""
        if not self._has_series():
            return []
        return self._rows(
            "SELECT series, source, prompts, MAX(samples_per_prompt) AS samples_per_prompt, COUNT(*) AS points, "
            "MIN(step) AS first_step, MAX(step) AS last_step FROM series_points WHERE run_id = ? "
            "GROUP BY series ORDER BY series", [run_id])

    # ------------------------------------------------------------------ fits
    @_user_errors
    def save_fit(self, run_id: int, key: str, fit: dict, points_digest: str) -> None:
        """Store (replace) a fit under ``key`` with the digest of the points it used.

        A read-only store keeps no fits: fitting still works, it is just not cached.
        """
        if self.readonly:
            return
        with self.transaction():
            self.db["fits"].insert({"run_id": run_id, "key": key, "fit": json.dumps(fit),
                                    "points_digest": points_digest, "created": _now()},
                                   replace=True)

    @_user_errors
    def get_fit(self, run_id: int, key: str) -> tuple[dict, str] | None:
        """``(fit, points_digest)`` stored under ``key``, or None."""
        rows = self._rows("SELECT * FROM fits WHERE run_id = ? AND key = ?", [run_id, key])
        if not rows:
            return None
        return json.loads(rows[0]["fit"]), rows[0]["points_digest"]


    # ------------------------------------------------------------------ adaptive ablations
    @_user_errors
    def add_stage(self, ablation: str, stage: int, rows: Iterable[dict], spent_hours: float) -> None:
        """Store one stage of an adaptive ablation (all its rows in one transaction;
        a stage stored again replaces its rows).  Row keys: those of
        :data:`STAGE_COLUMNS` (``flags`` a list, ``fit`` a dict).

        Raises:
            ValueError: an unknown key.
        """
        out = []
        for r in rows:
            unknown = set(r) - set(STAGE_COLUMNS)
            if unknown:
                raise ValueError(f"unknown stage keys {sorted(unknown)}; allowed: {sorted(STAGE_COLUMNS)}")
            row = dict(r, ablation=ablation, stage=stage, spent_hours=spent_hours, created=_now())
            row["flags"] = json.dumps(list(row.get("flags") or []))
            row["fit"] = None if row.get("fit") is None else json.dumps(row["fit"])
            row["is_base"] = int(bool(row.get("is_base")))
            out.append(row)
        with self.transaction():
            self.db["ablation_stages"].insert_all(out, replace=True)

    @_user_errors
    def stages(self, ablation: str) -> list[dict]:
        """An adaptive ablation's stage rows, by stage then in the order they were
        stored; ``flags`` and ``fit`` decoded."""
        rows = self._rows("SELECT * FROM ablation_stages WHERE ablation = ? ORDER BY stage, rowid", [ablation])
        out = []
        for r in rows:
            r = dict(r)
            r["flags"] = json.loads(r["flags"] or "[]")
            r["fit"] = json.loads(r["fit"]) if r.get("fit") else None
            r["is_base"] = bool(r["is_base"])
            out.append(r)
        return out


_INSERT_POINT = (f"INSERT OR REPLACE INTO eval_points ({', '.join(EVAL_POINT_COLUMNS)}) "
                 f"VALUES ({', '.join('?' * len(EVAL_POINT_COLUMNS))})")
_INSERT_SERIES_POINT = (f"INSERT OR REPLACE INTO series_points ({', '.join(SERIES_POINT_COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(SERIES_POINT_COLUMNS))})")

class _Transaction:
    def __init__(self, store: Store):
        self.store = store
        self.conn = store.conn
        self.outer = False

    def __enter__(self):
        self.outer = not self.conn.in_transaction
        if self.outer:
            self.store._check_integrity()
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise _sqlite_problem(self.store.path, exc) or exc from None
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self.outer:
            return False
        if exc_type is None:
            try:
                self.conn.execute("COMMIT")
                return False
            except sqlite3.Error as commit_exc:
                exc = commit_exc
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass                              # the original error is the one to report
        if isinstance(exc, sqlite3.Error):
            problem = _sqlite_problem(self.store.path, exc)
            if problem is not None:
                raise problem from None
            if exc_type is None:
                raise exc
        return False


def _connect(path: str, busy_timeout_ms: int, immutable: bool = False) -> sqlite3.Connection:
    """A connection with a busy timeout that has read the schema (a file that is not SQLite, or
    a WAL store in a folder we cannot write, fails here); ``immutable``: read-only, as the
    file holds it.  :meth:`Store.open` sets the WAL journal once the file is known to be a store."""
    if immutable:
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro&immutable=1"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    else:
        conn = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn




#: The ``runs`` columns held as JSON text, with what an empty one reads as.
JSON_RUN_FIELDS = {"recipe": {}, "job_ids": [], "warm_start": None}


def _decode_run(row: dict) -> dict:
    row = dict(row)
    for key, empty in JSON_RUN_FIELDS.items():
        value = row.get(key)
        row[key] = json.loads(value) if value else empty
    return row


def _point_row(run_id: int, point: EvalPoint | dict, now: str) -> dict:
    if isinstance(point, EvalPoint):
        point = point.to_dict()
    unknown = set(point) - set(EVAL_POINT_COLUMNS)
    if unknown:
        raise ValueError(f"unknown eval point keys {sorted(unknown)}; allowed: {sorted(EVAL_POINT_COLUMNS)}")
    if point.get("step") is None or point.get("pass_rate") is None:
        raise ValueError("an eval point needs at least step and pass_rate")
    row = dict(point)
    row["run_id"] = run_id
    row.setdefault("time", now)
    if isinstance(row.get("correct_counts"), (list, tuple)):
        row["correct_counts"] = json.dumps(list(map(int, row["correct_counts"])))
    return row
