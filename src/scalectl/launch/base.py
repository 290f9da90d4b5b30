"""One interface over the places a run can execute: this machine or Slurm.

A launcher turns a run (its folder holds ``job.json``, :mod:`scalectl.job.body`)
into a job with an id, reports the job's state in the store's vocabulary,
cancels it and names its log files.  What it submitted is recorded in
``RUN_DIR/launch.json`` (every submission: launcher, job id, log path, and
what the launcher needs to find the job again), and the job ids in the
store's ``runs.job_ids``.

The store's status is written by the job body itself (running, completed,
failed, cancelled); a job can also end without writing anything: killed by
``scancel``, requeued by a preemption, out of memory, a node lost.
:func:`reconcile` merges the store's status with what the launcher sees, and
:func:`refresh` writes the result back, with the tail of the job's log as the
error of a job that died silently.  No code here ever waits on a job's result
without a deadline.
"""

from __future__ import annotations

import json
import os
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

LAUNCH_FILE = "launch.json"

#: Store states a launcher can report, plus two that only say whether the job
#: is alive: ``active`` (alive, phase unknown) and ``ended`` (gone, outcome unknown).
LAUNCHER_STATES = ("pending", "running", "completed", "failed", "cancelled", "timed_out", "active", "ended")
TERMINAL = frozenset({"completed", "failed", "cancelled", "timed_out"})
ACTIVE = frozenset({"created", "pending", "running"})


def now_iso() -> str:
    """The current UTC time, ISO 8601, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunSpec:
    """What a launcher needs to start (or continue) one run.

    Attributes:
        run_id: the run's id in the store.
        name: the run's name (already checked by :func:`scalectl.names.check_name`).
        run_dir: the run folder, holding ``job.json``.
        recipe: the validated :class:`scalectl.recipe.schema.Recipe` (its ``launcher``
            and ``hardware`` sections size the job).

    The job body resumes from the run's latest checkpoint when there is one.
    """

    run_id: int
    name: str
    run_dir: Path
    recipe: object


@dataclass
class JobHandle:
    """A submitted job: enough to find it again from another process.

    Attributes:
        launcher: ``local`` or ``slurm``.
        job_id: the process id (local) or Slurm job id (``123``, or ``123_4``
            in an array).
        run_dir: the run folder.
        log: the job's log file (stdout and stderr together; task 0 on Slurm).
        submitted: ISO 8601 time of submission.
        info: launcher-specific data (local: process start time, process
            group; slurm: submitit folder, number of tasks).
    """

    launcher: str
    job_id: str
    run_dir: str
    log: str
    submitted: str = field(default_factory=now_iso)
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "JobHandle":
        return cls(**{k: data[k] for k in ("launcher", "job_id", "run_dir", "log", "submitted", "info") if k in data})


@dataclass(frozen=True)
class JobState:
    """What the launcher sees of a job.

    Attributes:
        state: one of :data:`LAUNCHER_STATES`, or None when the launcher
            cannot tell (Slurm forgot the job, no accounting).
        raw: the launcher's own word (``RUNNING``, ``CANCELLED by 0``, ``pid 123 alive``).
        restarts: how many times the job was requeued (Slurm), else 0.
    """

    state: str | None
    raw: str = ""
    restarts: int = 0


@dataclass(frozen=True)
class DryRun:
    """What a launcher would do with a run, submitting nothing.

    Attributes:
        summary: one line for people.
        data: JSON-ready details (Slurm: the submitit parameters and the sbatch script).
        script: a file the launcher would write (the sbatch script), to print verbatim, or None.
    """

    summary: str
    data: dict = field(default_factory=dict)
    script: str | None = None


class Launcher(ABC):
    """Where jobs run.  Implementations: :class:`scalectl.launch.local.LocalLauncher`,
    :class:`scalectl.launch.slurm.SlurmLauncher`; found by name in :mod:`scalectl.launch.registry`.

    Attributes:
        name: the launcher's name (``launcher.type``).
        runs_here: True when a run can also train in the calling process, in the
            foreground (``scalectl run`` without ``--detach``).
    """

    name: str = ""
    runs_here: bool = False

    @abstractmethod
    def submit(self, run: RunSpec) -> JobHandle:
        """Start ``run`` as a job that outlives the calling process.

        Raises:
            UserError: the launcher is unavailable or the run's resources are invalid.
        """

    def submit_many(self, runs: list[RunSpec], job_name: str | None = None) -> list[JobHandle]:
        """Start several runs (Slurm: one job array named ``job_name``, e.g. the ablation's
        name); default: one by one (``job_name`` unused)."""
        return [self.submit(r) for r in runs]

    @abstractmethod
    def state(self, job: JobHandle) -> JobState:
        """The job's state now; never blocks for long (a few seconds at most)."""

    @abstractmethod
    def cancel(self, job: JobHandle) -> None:
        """Stop the job (no error if it has ended already)."""

    def log_paths(self, job: JobHandle) -> list[Path]:
        """The job's log files, task 0 first."""
        return [Path(job.log)]

    def foreground_job(self, run_dir: str | Path) -> JobHandle:
        """Record the calling process as the job of a run trained in the foreground
        (only where :attr:`runs_here`)."""
        raise NotImplementedError(f"the {self.name} launcher cannot train a run in this process")

    @abstractmethod
    def dry_run(self, recipe, run_name: str, run_dir: Path, *, detach: bool = False) -> DryRun:
        """What :meth:`submit` would do for a run named ``run_name`` in ``run_dir``.

        Raises:
            UserError: the run could not be submitted as set up (e.g. an unsafe path).
        """


# --------------------------------------------------------------------------- the launch record


def record_job(run_dir: str | Path, job: JobHandle) -> None:
    """Append ``job`` to ``RUN_DIR/launch.json`` (atomically)."""
    path = Path(run_dir) / LAUNCH_FILE
    data = read_record(run_dir)
    data["jobs"].append(job.to_dict())
    tmp = path.with_name(f".{LAUNCH_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def read_record(run_dir: str | Path) -> dict:
    """``RUN_DIR/launch.json`` as ``{"jobs": [...]}`` (empty when missing)."""
    path = Path(run_dir) / LAUNCH_FILE
    if not path.exists():
        return {"jobs": []}
    return json.loads(path.read_text())


def last_job(run_dir: str | Path | None) -> JobHandle | None:
    """The latest job submitted for the run in ``run_dir``, or None."""
    if not run_dir:
        return None
    jobs = read_record(run_dir)["jobs"]
    return JobHandle.from_dict(jobs[-1]) if jobs else None


# --------------------------------------------------------------------------- store status vs launcher


def reconcile(store_status: str, launcher_state: str | None) -> str | None:
    """The status a run should have, given what the store and the launcher say.

    The job body writes the store; the launcher knows whether the job is
    still alive.  Rules:

    * the launcher cannot tell (None): keep the store's status;
    * the store says completed: the body finished, keep it;
    * the store says failed / cancelled / timed_out: keep it (a cancelled
      job may still be ``COMPLETING``);
    * the store says created / pending / running (the job should be alive):
      an alive job's phase (pending, running) wins; ``active`` keeps the
      store's phase; a job that ended without recording an outcome
      (``completed`` or ``ended``) failed; cancelled, failed and timed_out
      are taken as they are.

    Returns:
        The new status, or None when the store's status stands.
    """
    if launcher_state is None or store_status not in ACTIVE:
        return None
    if launcher_state == "active":
        return None
    if launcher_state in ("completed", "ended"):
        new = "failed"
    else:
        new = launcher_state
    return None if new == store_status else new


def log_tail(path: str | Path, lines: int = 20, max_bytes: int = 64_000) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    path = Path(path)
    if not path.is_file():
        return ""
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - max_bytes))
        text = fh.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------- progress in a log file


class LogReporter:
    """Training progress as plain lines on a stream (a job's log), flushed.

    Implements :class:`scalectl.rl.loop.Reporter`: one line per optimiser
    step (step, reward, compute) and one per evaluation point.
    """

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.total = None
        self.t0 = time.monotonic()

    def _print(self, message: str) -> None:
        stamp = datetime.now().strftime("%H:%M:%S")
        print(f"[{stamp}] {message}", file=self.stream, flush=True)

    def start(self, total_steps, first_step):
        self.total = total_steps
        self._print(f"training from step {first_step}" + (f" to {total_steps}" if total_steps else ""))

    def step(self, step, metrics):
        of = f"/{self.total}" if self.total else ""
        reward = metrics.get("reward")
        self._print(f"step {step}{of}" + (f"  reward {reward:+.3f}" if reward is not None else "")
                    + f"  flops {metrics.get('flops', 0):.3g}")

    def eval(self, step, point):
        self._print(f"eval step {step}: pass rate {point['pass_rate']:.3f}  truncation "
                    f"{point['truncation_rate']:.3f}  mean length {point['mean_length']:.1f}")

    def log(self, message):
        self._print(str(message))

    def stop(self):
        self._print(f"stopped after {time.monotonic() - self.t0:.1f} s")
