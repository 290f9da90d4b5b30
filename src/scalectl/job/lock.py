"""One process at a time trains a run folder: an exclusive lock on ``RUN_DIR/run.lock``.

Two ``scalectl run --resume NAME`` started a moment apart would otherwise both
read the same checkpoint and both train the folder, interleaving their steps.
The lock is taken before the run's files are read (``job.json``, checkpoints)
and held while the run trains: by the ``run`` command for a foreground run,
then by the job body (:func:`scalectl.job.body.run_job`) in whichever process
trains.  It is ``flock``-based, so it frees itself when its process dies, however
it dies; taking it again in the process that holds it is allowed (the
foreground ``run`` command holds it, then calls the job body in-process).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path
from typing import Iterator

from scalectl.errors import UserError

LOCK_FILE = "run.lock"

_held: dict[Path, int] = {}      # folders this process holds -> nesting depth


@contextlib.contextmanager
def run_folder_lock(run_dir: str | Path, name: str | None = None) -> Iterator[None]:
    """Hold the run folder's lock for the ``with`` block.

    Args:
        run_dir: the run folder (it must exist).
        name: the run's name, for the message.

    Raises:
        UserError: another process holds the lock (its pid and host are named),
            or the folder cannot be opened for the lock.
    """
    folder = Path(run_dir).resolve()
    if folder in _held:
        _held[folder] += 1
        try:
            yield
        finally:
            _held[folder] -= 1
        return
    try:
        fh = open(folder / LOCK_FILE, "a+")
    except OSError as exc:
        raise UserError(f"run folder {folder}: cannot take its lock ({exc.strerror})") from None
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise UserError(f"run {name or folder.name} is being trained by {holder} "
                            f"(its folder {folder} is locked); wait for it, or stop it with "
                            f"`scalectl cancel {name or folder.name}`") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        fh.flush()
        _held[folder] = 1
        try:
            yield
        finally:
            del _held[folder]
    finally:
        fh.close()                 # closing the file releases the lock
