"""Runs as processes on this machine.

``scalectl run`` trains in the foreground by default (live progress on the
terminal, Ctrl-C checkpoints and stops); ``--detach`` hands the run to
:class:`LocalLauncher`, which starts ``python -m scalectl.launch.local RUN_DIR``
in its own session: it survives the command that started it, writes its
progress to ``RUN_DIR/logs/local-N.log`` and records its outcome in the store.

At most ``launcher.max_parallel`` detached runs train at once: each holds
one of ``max_parallel`` slot files (``RUNS_DIR/.slots/slot-I.lock``, locked
with ``flock``, so a slot frees itself when its process dies, however it
dies); a run that finds none free waits in state ``pending``.

Cancelling sends SIGINT to the run's process group: the loop saves a
checkpoint and the run is marked cancelled (``scalectl run --resume RUN``
continues it); SIGKILL follows if it has not stopped within the grace period.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from scalectl.errors import UserError
from scalectl.launch.base import DryRun, JobHandle, JobState, Launcher, LogReporter, RunSpec, read_record, record_job

#: Popen objects of children started by this process (polled to reap them).
_CHILDREN: dict[int, subprocess.Popen] = {}


def process_start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat``
    field 22), or None if there is no such process (or no ``/proc``).  With the
    pid it identifies a process even after its pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):      # zombie or dead: it has exited
        return None
    return int(fields[19])


def pid_alive(pid: int, start_ticks: int | None = None) -> bool:
    """Whether process ``pid`` runs (and is the one started at ``start_ticks``)."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        return False
    ticks = process_start_ticks(pid)
    if ticks is None:
        if Path("/proc/self/stat").exists():
            return False
        try:                          # no /proc (not Linux): signal 0 only
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return start_ticks is None or ticks == start_ticks


def default_slot_dir(run_dir: Path) -> Path:
    """Where the slot files of runs in ``run_dir``'s parent folder live."""
    return Path(run_dir).parent / ".slots"


class LocalLauncher(Launcher):
    """Detached processes on this machine, at most ``launcher.max_parallel`` training at once.

    Args:
        python: the interpreter that runs the job (default: this one).
        slot_dir: the folder of slot files (default: ``RUNS_DIR/.slots``).
    """

    name = "local"
    runs_here = True

    def __init__(self, python: str | None = None, slot_dir: str | Path | None = None):
        self.python = python or sys.executable
        self.slot_dir = slot_dir

    def command(self, run: RunSpec) -> list[str]:
        """The command line of the detached job."""
        slot_dir = Path(self.slot_dir) if self.slot_dir else default_slot_dir(run.run_dir)
        cmd = [self.python, "-m", "scalectl.launch.local", str(Path(run.run_dir).resolve()),
               "--slots", str(run.recipe.launcher.max_parallel), "--slot-dir", str(slot_dir)]
        return cmd

    def submit(self, run: RunSpec) -> JobHandle:
        run_dir = Path(run.run_dir).resolve()
        logs = run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"local-{len(read_record(run_dir)['jobs'])}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with log.open("ab") as fh:
            proc = subprocess.Popen(self.command(run), stdin=subprocess.DEVNULL, stdout=fh,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, env=env)
        _CHILDREN[proc.pid] = proc
        job = JobHandle("local", str(proc.pid), str(run_dir), str(log),
                        info={"pgid": proc.pid, "start_ticks": process_start_ticks(proc.pid),
                              "host": socket.gethostname()})
        record_job(run_dir, job)
        return job

    def dry_run(self, recipe, run_name: str, run_dir: Path, *, detach: bool = False) -> DryRun:
        return DryRun("launcher local: " + ("a background process (--detach)" if detach else
                                            "in this process, in the foreground"))

    def foreground_job(self, run_dir: str | Path) -> JobHandle:
        """Record this very process as the job of a run trained in the foreground
        (so that ``scalectl status`` notices if it dies)."""
        pid = os.getpid()
        job = JobHandle("local", str(pid), str(Path(run_dir).resolve()), "",
                        info={"pgid": None, "start_ticks": process_start_ticks(pid),
                              "host": socket.gethostname(), "foreground": True})
        record_job(run_dir, job)
        return job

    def state(self, job: JobHandle) -> JobState:
        host = job.info.get("host")
        if host and host != socket.gethostname():
            return JobState(None, f"process {job.job_id} on host {host} (not this one)")
        if pid_alive(int(job.job_id), job.info.get("start_ticks")):
            return JobState("active", "alive")
        return JobState("ended", "exited")

    def cancel(self, job: JobHandle, grace_s: float = 60.0) -> None:
        """SIGINT (checkpoint, then stop), then SIGKILL after ``grace_s`` seconds."""
        pid, ticks = int(job.job_id), job.info.get("start_ticks")
        if not pid_alive(pid, ticks):
            return
        pgid = job.info.get("pgid")

        def send(sig):
            try:
                if pgid:
                    os.killpg(int(pgid), sig)
                else:
                    os.kill(pid, sig)
            except ProcessLookupError:
                pass

        send(signal.SIGINT)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not pid_alive(pid, ticks):
                return
            time.sleep(0.1)
        send(signal.SIGKILL)

    def log_paths(self, job: JobHandle) -> list[Path]:
        return [Path(job.log)] if job.log else []


# --------------------------------------------------------------------------- the detached job


def acquire_slot(slot_dir: Path, slots: int, on_wait=None, poll_s: float = 1.0):
    """Lock one of ``slots`` slot files in ``slot_dir``, waiting until one is free.

    Returns:
        The open file holding the lock (keep it open: closing it frees the slot).
    """
    slot_dir.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        for i in range(slots):
            fh = open(slot_dir / f"slot-{i}.lock", "a+")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                continue
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
            return fh
        if not waited and on_wait:
            on_wait()
        waited = True
        time.sleep(poll_s)


def _sigterm_to_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Body of a detached local job: take a slot, then :func:`scalectl.job.body.run_job`."""
    parser = argparse.ArgumentParser(prog="python -m scalectl.launch.local")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--slot-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    # `scalectl cancel` sends SIGINT; a job started from a background shell (`make test &`,
    # nohup, some CI runners) inherits SIGINT ignored, and Python keeps it so: restore it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    reporter = LogReporter(sys.stdout)

    from scalectl.job.body import record_status, run_job

    slot_dir = args.slot_dir or default_slot_dir(args.run_dir)
    try:
        def waiting():
            reporter.log(f"waiting for a free slot (launcher.max_parallel = {args.slots}, {slot_dir})")
        slot = acquire_slot(slot_dir, max(1, args.slots), on_wait=waiting)
    except KeyboardInterrupt:
        record_status(args.run_dir, "cancelled", "cancelled while waiting for a slot")
        return 130
    reporter.log(f"pid {os.getpid()} on {socket.gethostname()}, slot {Path(slot.name).name}")
    try:
        run_job(args.run_dir, reporter=reporter)
    except KeyboardInterrupt:
        reporter.log("cancelled: checkpoint saved; continue with `scalectl run --resume "
                     f"{Path(args.run_dir).name}`")
        return 130
    finally:
        slot.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
