"""Runs as Slurm jobs, through submitit's ``SlurmExecutor``.

The setup's ``[launcher.slurm]`` section maps onto submitit's sbatch
parameters (:func:`submitit_parameters`); several runs go out as one job
array (``executor.batch()``), at most ``launcher.max_parallel`` running at
once.  Every submission gets a fresh submitit folder (``RUN_DIR/slurm/NN``;
job ids restart at 1 when a cluster's state is purged, and submitit names
its files by job id).

Preemption and time limits: the job is a submitit ``Checkpointable``
(:class:`SlurmRunJob`).  Slurm sends SIGUSR2 ``signal_delay_s`` seconds
before the end; submitit then calls :meth:`SlurmRunJob.checkpoint`, which
resubmits the job, and requeues it.  However a job is requeued (``scontrol
requeue``, a preemption that kills it), the job body resumes it from the
run's latest checkpoint.  Work since that checkpoint is
redone; evaluation points of redone steps replace the earlier ones (the
store keeps one point per (run, step)), so none is duplicated or lost.

States come from the controller (``scontrol show job``, which remembers a
finished job for a few minutes) and then accounting (``sacct``); no code here
calls submitit's ``job.result()`` (which waits forever for a job cancelled
before writing its result when there is no accounting): :func:`wait` polls
the state with a deadline and reads the result files itself.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from scalectl.errors import UserError
from scalectl.launch.base import (
    TERMINAL, DryRun, JobHandle, JobState, Launcher, LogReporter, RunSpec, log_tail, read_record, record_job,
)
from scalectl.names import check_name

#: The folder every task of a job sees, where task 0 publishes its rendezvous port: the job's
#: submitit folder (read by :func:`scalectl.rl.transport.roles.detect`, which names it the same).
RENDEZVOUS_ENV = "SCALECTL_RENDEZVOUS_DIR"

#: Slurm job states (``squeue``/``sacct`` words) -> store states.
SLURM_STATES = {
    "PENDING": "pending", "REQUEUED": "pending", "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending",
    "CONFIGURING": "pending", "RESV_DEL_HOLD": "pending", "SUSPENDED": "pending", "STOPPED": "pending",
    "RUNNING": "running", "RESIZING": "running", "UPDATE_DB": "running", "POWER_UP_NODE": "pending",
    # ending, outcome not known yet (it may be requeued): the store's word stands
    "COMPLETING": "active", "SIGNALING": "active", "STAGE_OUT": "active",
    "COMPLETED": "completed", "CANCELLED": "cancelled", "TIMEOUT": "timed_out",
    "FAILED": "failed", "NODE_FAIL": "failed", "BOOT_FAIL": "failed", "OUT_OF_MEMORY": "failed",
    "DEADLINE": "failed", "PREEMPTED": "failed", "SPECIAL_EXIT": "failed", "REVOKED": "failed",
}

_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,+=:@%-]+$")
_SAFE_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,40}$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_.,+=:@/-]+$")
_SAFE_HOSTLIST = re.compile(r"^[A-Za-z0-9_.,\[\]-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def map_state(word: str) -> str | None:
    """A Slurm state word (``RUNNING``, ``CANCELLED by 0``, ``OUT_OF_MEMORY+``) -> store state, or None."""
    key = word.strip().split(" ")[0].rstrip("+").upper() if word.strip() else ""
    return SLURM_STATES.get(key)


def signal_delay_s(time_min: int) -> int:
    """Seconds between the pre-emption/time-limit signal and the kill: submitit's
    90 s, but at most a quarter of the time limit (and at least 15 s)."""
    return int(max(15, min(90, time_min * 60 // 4)))


def _mem(mem_gb: float) -> str:
    return f"{int(mem_gb)}GB" if float(mem_gb).is_integer() else f"{int(mem_gb * 1024)}MB"


def check_slurm_value(value: str, what: str) -> str:
    """Refuse a Slurm name (partition, account, qos) with characters beyond ``A-Za-z0-9_.,+=:@%-``.

    Raises:
        UserError: naming the key and what is allowed.
    """
    if not isinstance(value, str) or not _SAFE_VALUE.match(value):
        raise UserError(f"{what} = {value!r} is not allowed: use letters, digits and _ . , + = : @ % -")
    return value


def check_slurm_path(path: str | Path, what: str = "Slurm job folder") -> str:
    """Refuse a path that cannot be written safely into an sbatch script
    (whitespace, quotes, control characters, shell metacharacters).

    Raises:
        UserError: naming the path and what is allowed.
    """
    text = str(path)
    if not _SAFE_PATH.match(text):
        raise UserError(f"{what} {text!r} is not allowed in an sbatch script: use a path of letters, "
                        "digits and _ . , + = : @ / - (no spaces, quotes or control characters); "
                        "pass --runs-dir to choose another folder")
    return text


def check_hostlist(value: str, what: str) -> str:
    """Refuse a Slurm host list with characters beyond ``A-Za-z0-9_.,-[]`` or that does not parse.

    Raises:
        UserError: naming the key and what is allowed.
    """
    from scalectl.names import expand_hostlist

    if not isinstance(value, str) or not _SAFE_HOSTLIST.match(value):
        raise UserError(f"{what} = {value!r} is not a Slurm host list: use host names of letters, digits and "
                        "_ . - with ranges in brackets, e.g. inf[01-04],big1")
    try:
        expand_hostlist(value)
    except ValueError as exc:
        raise UserError(f"{what} = {value!r} is not a Slurm host list: {exc}") from None
    return value


def _placement(recipe, params: dict, extra: dict, folder) -> None:
    """A job placed by role (``launcher.slurm.generator_nodes`` > 0): the batch script writes one
    host per task (:mod:`scalectl.launch.placement`) and srun places the tasks by it."""
    from scalectl.launch.placement import setup_lines

    s, hw = recipe.launcher.slurm, recipe.hardware
    named = [check_hostlist(v, f"launcher.slurm.{k}") for k, v in
             (("generator_nodelist", s.generator_nodelist), ("trainer_nodelist", s.trainer_nodelist)) if v]
    if named:
        extra["nodelist"] = ",".join(named)
    params["ntasks_per_node"] = int(s.tasks_per_node)
    extra.pop("ntasks", None)
    params["setup"] = setup_lines(s, hw.generators, hw.trainers, str(folder) if folder else None)
    params["srun_args"] = [f"--ntasks={hw.generators + hw.trainers}", "--distribution=arbitrary"]


def submitit_parameters(recipe, job_name: str, folder: str | Path | None = None) -> dict:
    """The submitit ``SlurmExecutor`` parameters (sbatch options) of a run.

    ``launcher.slurm`` -> submitit: partition, account, qos, nodes,
    tasks_per_node -> ntasks_per_node (several nodes) or sbatch's ``--ntasks`` (one
    node: the same tasks, and the form Slurm accepts with ``--overcommit``, e.g.
    ``SBATCH_OVERCOMMIT=1``, when a node has fewer CPUs than tasks; it refuses a
    ``--ntasks-per-node`` above the node's CPUs), gpus_per_node (when > 0), cpus_per_task,
    mem_gb -> mem, time_min -> time (minutes), additional_parameters (sbatch
    long options without ``--``).  Also: the job name, stdout and stderr in one
    log, ``--requeue`` and the signal delay (:func:`signal_delay_s`).  A job placed by role
    (``generator_nodes`` > 0) asks for nodes x tasks_per_node task slots (with ``--nodelist``
    for the role node lists) and starts generators + trainers tasks by a host file its batch
    script writes (``setup``, ``srun_args``: :mod:`scalectl.launch.placement`; ``folder``, the
    submitit folder, holds the file).

    Raises:
        UserError: an unsafe name or value (one that could break out of its
            ``#SBATCH`` line), or a task count that differs from
            hardware.generators + hardware.trainers for a multi-task job.
    """
    s = recipe.launcher.slurm
    params: dict = {
        "job_name": check_name(job_name, "Slurm job name"),
        "time": int(s.time_min),
        "nodes": int(s.nodes),
        "cpus_per_task": int(s.cpus_per_task),
        "stderr_to_stdout": True,
        "signal_delay_s": signal_delay_s(s.time_min),
    }
    if s.gpus_per_node:
        params["gpus_per_node"] = int(s.gpus_per_node)
    for key in ("partition", "account", "qos"):
        value = getattr(s, key)
        if value is not None:
            params[key] = check_slurm_value(value, f"launcher.slurm.{key}")
    if s.mem_gb is not None:
        params["mem"] = _mem(s.mem_gb)
    extra: dict = {"requeue": True}
    if s.nodes == 1:
        extra["ntasks"] = int(s.tasks_per_node)
    else:
        params["ntasks_per_node"] = int(s.tasks_per_node)
    for key, value in (s.additional_parameters or {}).items():
        if not _SAFE_KEY.match(key):
            raise UserError(f"launcher.slurm.additional_parameters key {key!r} is not an sbatch option "
                            "name (lower-case letters, digits, - and _)")
        if _CONTROL.search(str(value)):
            raise UserError(f"launcher.slurm.additional_parameters.{key} = {value!r} contains a control "
                            "character (newline, tab, ...)")
        extra[key] = value
    if s.generator_nodes > 0:
        _placement(recipe, params, extra, folder)
    params["additional_parameters"] = extra
    return params


def job_tasks(params: dict) -> int:
    """Tasks of a job with submitit parameters ``params``: srun's ``--ntasks`` when given (a job
    placed by role), else sbatch's ``ntasks`` (in ``additional_parameters``), else nodes x
    ntasks_per_node (each 1 when absent)."""
    extra = params.get("additional_parameters") or {}
    for arg in params.get("srun_args") or []:
        if arg.startswith("--ntasks="):            # placed by role: srun starts these
            return int(arg.split("=", 1)[1])
    if "ntasks" in extra:
        return int(extra["ntasks"])
    return int(params.get("nodes", 1)) * int(params.get("ntasks_per_node", 1) or 1)


def submitit_command(folder: str | Path, python: str | None = None) -> str:
    """The command line an sbatch script runs (as submitit writes it)."""
    return " ".join([shlex.quote(python or sys.executable), "-u -m submitit.core._submit",
                     shlex.quote(str(folder))])


def sbatch_script(recipe, job_name: str, folder: str | Path) -> str:
    """The sbatch script submitit would submit for this run (nothing is submitted)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = submitit_parameters(recipe, job_name, folder)
    return _make_sbatch_string(command=submitit_command(folder), folder=str(folder), **params)


# --------------------------------------------------------------------------- job states


def _run(cmd: list[str], timeout: float = 15.0, conf: str | None = None) -> subprocess.CompletedProcess:
    """Run a Slurm command; ``conf``: the cluster's ``slurm.conf`` (``$SLURM_CONF``) the job was
    submitted with, so that a job is asked about on its own cluster."""
    if shutil.which(cmd[0]) is None:
        raise UserError(f"`{cmd[0]}` not found: the slurm launcher needs Slurm's commands on PATH "
                        "(scripts/slurm-local.sh start sets up a one-node cluster on this machine)")
    env = dict(os.environ, SLURM_CONF=conf) if conf else None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]} timed out after {timeout:.0f} s")


def _fields(line: str) -> dict:
    out = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep and key not in out:
            out[key] = value
    return out


def query_state(job_id: str, conf: str | None = None) -> JobState:
    """The state of Slurm job ``job_id`` (``123`` or ``123_4``): the controller
    first, accounting (``sacct``) for jobs the controller has forgotten; ``conf``: the
    ``slurm.conf`` of the job's cluster (default ``$SLURM_CONF``, else Slurm's own).

    Returns:
        :class:`JobState` with state None when neither knows the job.

    Raises:
        UserError: Slurm's commands are not installed.
    """
    proc = _run(["scontrol", "show", "job", "-o", str(job_id)], conf=conf)
    if proc.returncode == 0 and proc.stdout.strip():
        lines = proc.stdout.strip().splitlines()
        info = next((f for f in map(_fields, lines)
                     if f.get("JobId") == str(job_id)
                     or f"{f.get('ArrayJobId')}_{f.get('ArrayTaskId')}" == str(job_id)), _fields(lines[0]))
        word = info.get("JobState", "")
        reason = info.get("Reason", "None")
        raw = word + (f" ({reason})" if reason not in ("None", "") else "")
        return JobState(map_state(word), raw, int(info.get("Restarts", 0) or 0))
    acct = _run(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "JobID,State"], conf=conf)
    if acct.returncode == 0:
        for line in acct.stdout.strip().splitlines():
            jid, _, word = line.partition("|")
            if jid == str(job_id) or (jid.startswith(f"{job_id}_[") and "_" not in str(job_id)):
                return JobState(map_state(word), word.strip())
    detail = (proc.stderr or proc.stdout).strip() or "unknown to the controller"
    return JobState(None, f"unknown ({detail})")


# --------------------------------------------------------------------------- the job body


#: Seconds a task of a job being cancelled waits, its own part done (checkpoint saved, run
#: recorded), for the job's other tasks to finish theirs; then it exits as before (a job still
#: running is cancelled outright by :meth:`SlurmLauncher.cancel` after its grace).
CANCEL_WAIT_S = 120.0


def own_job_id(env=None) -> str | None:
    """This Slurm job's id as scancel and squeue name it: ``A_I`` for task I of array A, else
    ``$SLURM_JOB_ID``; None outside a Slurm job."""
    env = os.environ if env is None else env
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def ended_folder(folder: str | Path, env=None) -> Path:
    """Where the tasks of this start of this job (``$SLURM_JOB_ID``, ``$SLURM_RESTART_COUNT``)
    say that they have ended, in the job's submitit folder ``folder`` (every task sees it)."""
    env = os.environ if env is None else env
    return Path(folder) / f"ended-{env.get('SLURM_JOB_ID', '0')}-{env.get('SLURM_RESTART_COUNT', '0')}"

#: How a task of a job ended (:func:`mark_ended`): the run recorded cancelled by this task,
#: interrupted otherwise (a task that does not record the run, or a requeue), returned, failed.
TASK_ENDINGS = ("cancelled", "interrupted", "returned", "failed")


def mark_ended(folder: Path, task: int, ending: str) -> None:
    """Write ``FOLDER/TASK.ENDING`` (``ending``: one of :data:`TASK_ENDINGS`), atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{task}.{os.getpid()}.tmp"
    tmp.write_text("")
    tmp.replace(folder / f"{task}.{ending}")


def ended_tasks(folder: Path) -> dict[int, str]:
    """Task -> ending of the tasks that have written theirs in ``folder`` (:func:`mark_ended`)."""
    out = {}
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return out
    for name in names:
        task, _, ending = name.partition(".")
        if task.isdigit() and ending in TASK_ENDINGS:
            out[int(task)] = ending
    return out


def _running_as_started(env) -> bool:
    """Whether this job is still running as the start of it that ``env`` belongs to (not requeued
    since: the controller's restart count is ``$SLURM_RESTART_COUNT``)."""
    try:
        seen = query_state(own_job_id(env) or "", env.get("SLURM_CONF"))
    except UserError:                        # no Slurm commands on this node
        return False
    return seen.state in ("running", "active") and seen.restarts == int(env.get("SLURM_RESTART_COUNT") or 0)


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def exit_without_teardown() -> None:
    """End this process with status 0 once submitit has written the job's result and returned
    (the first ``atexit`` handler to run, registered last), skipping the interpreter's teardown.

    A task of a job of several tasks holds gloo process groups (its
    :class:`~scalectl.rl.transport.stream.Channel`, the trainers' group) whose destruction at
    interpreter exit can abort the process ("terminate called without an active exception",
    status 134) after its run has completed: Slurm then records the job FAILED.  The tasks the
    local supervisor spawns end the same way (:mod:`scalectl.rl.processes.supervise`).  Called
    only on success: a task that failed still exits as Python does (status 1).
    """
    import atexit

    atexit.register(_exit_now)


class SlurmRunJob:
    """The callable every task of a Slurm job runs: :func:`scalectl.job.body.run_job` on the run folder.

    Checkpointable in submitit's sense (it has :meth:`checkpoint`): on
    pre-emption or time limit the job is resubmitted and resumes from its last
    checkpoint.  Which task trains, whether to resume and every status are the
    job body's decisions; this class only says what Slurm's exceptions mean,
    and ends a cancelled job as Slurm's CANCELLED (:meth:`task_ended`).
    """

    def __init__(self):
        self._requeued = False
        self._cancelled = False

    def stop_status(self, exc: BaseException) -> tuple[str, str] | None:
        """(status, error) for a stop Slurm explains: the time limit, or a requeue."""
        from submitit.core.utils import UncompletedJobError

        if isinstance(exc, UncompletedJobError):
            return "timed_out", f"{exc} (resume with `scalectl run --resume`)"
        if self._requeued:
            return "pending", "requeued after pre-emption or time limit; resumes from its last checkpoint"
        return None

    def recorded_cancelled(self) -> None:
        """Told by the job body that this task has recorded the run cancelled."""
        self._cancelled = True

    @staticmethod
    def _scancel_self(why: str) -> None:
        """``scancel`` this job (every task of it), saying ``why`` in the task's log."""
        job_id = own_job_id()
        if not job_id:
            return
        print(f"ending Slurm job {job_id}: {why}", flush=True)
        try:
            proc = _run(["scancel", job_id])
        except UserError as err:             # no scancel on this node: the job ends as Slurm sees fit
            print(f"could not end Slurm job {job_id}: {err}", flush=True)
            return
        if proc.returncode != 0:
            print(f"scancel {job_id} failed: {(proc.stderr or proc.stdout).strip()}", flush=True)

    @classmethod
    def end_job(cls, exc: BaseException) -> None:
        """Cancel this job (``scancel``) once the run's failure ``exc`` (a task lost or stuck) is
        recorded: its tasks on every node still reachable stop now, instead of waiting for a dead
        node's tasks until Slurm marks the node down and then requeueing the job into a run
        recorded failed (``scalectl run --resume`` continues it, on the nodes that remain)."""
        cls._scancel_self(f"{exc} (resume with `scalectl run --resume`)")

    def task_ended(self, ending: str, env=None, wait_s: float = CANCEL_WAIT_S) -> None:
        """End a cancelled job as Slurm's own CANCELLED, not FAILED: once the run is recorded
        cancelled and every task of the job has done its part, ``scancel`` the job.

        ``ending`` says how this task's :func:`~scalectl.job.body.run_job` ended (one of
        :data:`TASK_ENDINGS`).  A one-task job that recorded the run cancelled cancels itself at
        once.  In a job of several tasks each task writes its ending (:func:`mark_ended`, in
        :func:`ended_folder`); one that was interrupted (its exit would be a failure, and
        ``KillOnBadExit`` would kill the others) waits, at most ``wait_s`` seconds, until every
        task has written its own; the task that sees them all, one of them ``cancelled``,
        cancels the job.  No task is thus killed before its checkpoint and its part of the run's
        cleanup are done.  A job that is no longer running as this start of it (requeued: a
        pre-emption's SIGUSR2 interrupts every task of a multi-task job too) is left alone, and
        so is everything outside a Slurm job."""
        env = os.environ if env is None else env
        if not env.get("SLURM_JOB_ID"):
            return
        tasks = int(env.get("SLURM_NTASKS", "1") or 1)
        if tasks <= 1:
            if ending == "cancelled" and _running_as_started(env):
                self._scancel_self("the run is recorded cancelled and checkpointed")
            return
        if not env.get(RENDEZVOUS_ENV):
            return
        folder = ended_folder(env[RENDEZVOUS_ENV], env)
        mark_ended(folder, int(env.get("SLURM_PROCID", "0")), ending)
        seen = ended_tasks(folder)
        deadline = time.monotonic() + wait_s
        while ending in ("cancelled", "interrupted") and len(seen) < tasks and time.monotonic() < deadline:
            time.sleep(0.5)
            seen = ended_tasks(folder)
        if len(seen) >= tasks and "cancelled" in seen.values() and _running_as_started(env):
            self._scancel_self(f"the run is recorded cancelled and checkpointed, and all {tasks} tasks "
                               "have done their part")

    def __call__(self, run_dir: str) -> dict | None:
        import submitit

        from scalectl.job.body import run_job

        reporter = LogReporter(sys.stdout)
        env = os.environ
        try:                         # this task's log, which the job's other tasks name if it dies
            paths = submitit.JobEnvironment().paths
            task_log = str(paths.stdout)
            env.setdefault(RENDEZVOUS_ENV, str(paths.folder))   # where task 0 publishes its port
        except (RuntimeError, KeyError):   # not inside a submitit job (called directly)
            task_log = None
        reporter.log(f"Slurm job {own_job_id()} task {env.get('SLURM_PROCID', '0')}/{env.get('SLURM_NTASKS', '1')} "
                     f"on {os.uname().nodename} (node {env.get('SLURM_NODEID', '0')} of "
                     f"{env.get('SLURM_JOB_NODELIST', '?')}), restart {env.get('SLURM_RESTART_COUNT', '0')}")
        ending = "failed"
        try:
            result = run_job(run_dir, reporter=reporter, stop_status=self.stop_status, task_log=task_log,
                             end_job=self.end_job, on_cancelled=self.recorded_cancelled)
            ending = "returned"
            if task_log is not None and int(env.get("SLURM_NTASKS", "1") or 1) > 1:
                exit_without_teardown()
            return result
        except KeyboardInterrupt:
            ending = "cancelled" if self._cancelled else "interrupted"
            raise
        finally:
            self.task_ended(ending)

    def checkpoint(self, run_dir: str):
        """Called by submitit on SIGUSR2: the same run in the requeued job (it resumes)."""
        from submitit.helpers import DelayedSubmission

        self._requeued = True
        return DelayedSubmission(SlurmRunJob(), run_dir)


# --------------------------------------------------------------------------- the launcher


class SlurmLauncher(Launcher):
    """Slurm jobs through submitit (one job per run, or one array for many runs)."""

    name = "slurm"

    def _executor(self, folder: Path, params: dict):
        import submitit

        check_slurm_path(folder)
        try:
            executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=MAX_TIMEOUTS)
        except RuntimeError as exc:
            raise UserError(f"the slurm launcher needs Slurm on this machine: {exc} "
                            "(scripts/slurm-local.sh start sets up a one-node cluster)") from None
        executor.update_parameters(**params)
        return executor

    def _submit(self, executor, runs: list[RunSpec]) -> list:
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        try:
            if len(runs) == 1:
                return [executor.submit(SlurmRunJob(), str(Path(runs[0].run_dir).resolve()))]
            jobs = []
            with executor.batch():
                for r in runs:
                    jobs.append(executor.submit(SlurmRunJob(), str(Path(r.run_dir).resolve())))
            return jobs
        except (FailedJobError, FailedSubmissionError, subprocess.CalledProcessError) as exc:
            raise UserError(f"sbatch refused the job: {str(exc).strip()}") from None

    def dry_run(self, recipe, run_name: str, run_dir: Path, *, detach: bool = False) -> DryRun:
        """The submitit parameters and the sbatch script of the run's first submission."""
        folder = Path(run_dir) / "slurm" / "00"
        check_slurm_path(folder)
        params = submitit_parameters(recipe, run_name, folder)
        script = sbatch_script(recipe, run_name, folder)
        return DryRun(f"launcher slurm: submitit SlurmExecutor parameters {params}",
                      {"submitit_parameters": params, "sbatch_script": script}, script)

    def submit(self, run: RunSpec) -> JobHandle:
        run_dir = Path(run.run_dir).resolve()
        folder = run_dir / "slurm" / f"{len(read_record(run_dir)['jobs']):02d}"
        params = submitit_parameters(run.recipe, run.name, folder)
        job = self._submit(self._executor(folder, params), [run])[0]
        return self._record(job, run_dir, folder, params)

    def submit_many(self, runs: list[RunSpec], job_name: str | None = None) -> list[JobHandle]:
        """Submit runs as job arrays, one array per distinct set of sbatch
        parameters, at most ``launcher.max_parallel`` array tasks at once.

        Args:
            job_name: the arrays' ``--job-name`` (what squeue and sacct show), made safe for
                sbatch (:func:`scalectl.names.job_name`): an ablation's name; default
                ``scalectl``.  A single run goes out as its own job, named after the run.
        """
        from scalectl.names import job_name as safe_job_name

        if len(runs) <= 1:
            return [self.submit(r) for r in runs]
        job_name = safe_job_name(job_name or "scalectl")
        groups: dict[str, list[RunSpec]] = {}
        for r in runs:
            params = submitit_parameters(r.recipe, job_name)
            params["array_parallelism"] = int(r.recipe.launcher.max_parallel)
            groups.setdefault(repr(sorted(params.items())), []).append(r)
        handles: dict[int, JobHandle] = {}
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for i, (_, group) in enumerate(groups.items()):
            folder = Path(group[0].run_dir).resolve().parent / ".slurm-arrays" / f"{stamp}-{os.getpid()}-{i}"
            params = submitit_parameters(group[0].recipe, job_name, folder)
            params["array_parallelism"] = int(group[0].recipe.launcher.max_parallel)
            jobs = self._submit(self._executor(folder, params), group)
            for r, job in zip(group, jobs):
                handles[id(r)] = self._record(job, Path(r.run_dir).resolve(), folder, params)
        return [handles[id(r)] for r in runs]

    @staticmethod
    def _record(job, run_dir: Path, folder: Path, params: dict) -> JobHandle:
        handle = JobHandle("slurm", str(job.job_id), str(run_dir), str(job.paths.stdout),
                           info=_job_info(folder, params))
        record_job(run_dir, handle)
        return handle

    def state(self, job: JobHandle) -> JobState:
        return query_state(job.job_id, job.info.get("slurm_conf"))

    def cancel(self, job: JobHandle, grace_s: float = 90.0) -> None:
        """Stop a job as Ctrl-C stops a local run: a queued job is removed; a running one gets
        SIGINT in every task, on which the job body saves a checkpoint and records the run
        cancelled (plain ``scancel`` sends SIGTERM, which submitit passes over, then SIGKILL:
        no checkpoint); once every task has done its part the job cancels itself, so that Slurm
        too says CANCELLED (:meth:`SlurmRunJob.task_ended`).  A job still running ``grace_s``
        seconds later (Slurm's warning before a time limit is 90 s too) is cancelled outright.

        Raises:
            UserError: scancel failed other than on a job that has ended.
        """
        self._scancel(job, "--state=PENDING")
        self._scancel(job, "--signal=INT", "--state=RUNNING")
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if query_state(job.job_id, job.info.get("slurm_conf")).state not in ("running", "active"):
                return
            time.sleep(0.5)
        self._scancel(job)

    @staticmethod
    def _scancel(job: JobHandle, *args: str) -> None:
        proc = _run(["scancel", *args, str(job.job_id)], conf=job.info.get("slurm_conf"))
        if proc.returncode != 0 and "already completed" not in proc.stderr and "Invalid job id" not in proc.stderr:
            raise UserError(f"scancel {job.job_id} failed: {proc.stderr.strip()}")

    def log_paths(self, job: JobHandle) -> list[Path]:
        from submitit.core.utils import JobPaths

        folder = job.info.get("folder")
        if not folder:
            return [Path(job.log)]
        return [JobPaths(folder, job.job_id, t).stdout for t in range(int(job.info.get("tasks", 1)))]


# --------------------------------------------------------------------------- any function as a job


def _job_info(folder: Path, params: dict) -> dict:
    """A job handle's ``info``: its submitit folder, its task count, and the ``slurm.conf`` of
    the cluster it went to when ``$SLURM_CONF`` names one (asked again for its state)."""
    info = {"folder": str(folder), "tasks": job_tasks(params)}
    if os.environ.get("SLURM_CONF"):
        info["slurm_conf"] = str(Path(os.environ["SLURM_CONF"]).resolve())
    return info


class JobFailed(RuntimeError):
    """A Slurm job ended without a result: its state and the tail of its log."""


class InJob:
    """``fn`` as a Slurm job runs it: with ``$SCALECTL_RENDEZVOUS_DIR`` set to the job's
    submitit folder (seen by every task), where task 0 publishes its rendezvous port
    (:func:`scalectl.rl.transport.roles.rendezvous_store`)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        import submitit

        try:
            os.environ.setdefault(RENDEZVOUS_ENV, str(submitit.JobEnvironment().paths.folder))
        except (RuntimeError, KeyError):   # not inside a submitit job
            pass
        return self.fn(*args, **kwargs)


def submit_function(fn, *args, folder: str | Path, params: dict, **kwargs) -> JobHandle:
    """Submit ``fn(*args, **kwargs)`` as one Slurm job (every task runs it).

    Args:
        folder: a fresh submitit folder.
        params: submitit ``SlurmExecutor`` parameters (e.g. from
            :func:`submitit_parameters`, or ``{"ntasks_per_node": 2, "time": 5}``).

    Returns:
        A handle for :func:`wait` (not recorded in any run folder).
    """
    folder = Path(folder).resolve()
    executor = SlurmLauncher()._executor(folder, params)
    job = executor.submit(InJob(fn), *args, **kwargs)
    return JobHandle("slurm", str(job.job_id), str(folder), str(job.paths.stdout), info=_job_info(folder, params))


def wait(job: JobHandle, timeout_s: float, poll_s: float = 0.5) -> list:
    """Wait (at most ``timeout_s`` seconds) for a job from :func:`submit_function`
    to finish, and return each task's result, task 0 first.

    Raises:
        JobFailed: the job was cancelled, failed, timed out, raised, or
            finished without writing its result; the message holds its log tail.
        TimeoutError: still not finished after ``timeout_s``.
    """
    from submitit.core.utils import JobPaths, pickle_load

    deadline = time.monotonic() + timeout_s
    seen = JobState(None)
    while time.monotonic() < deadline:
        seen = query_state(job.job_id, job.info.get("slurm_conf"))
        if seen.state in TERMINAL:
            break
        time.sleep(poll_s)
    else:
        raise TimeoutError(f"Slurm job {job.job_id} still {seen.raw or 'unknown'} after {timeout_s:.0f} s")
    folder = job.info["folder"]
    if seen.state != "completed":
        error = pickle_load(JobPaths(folder, job.job_id, 0).result_pickle) \
            if JobPaths(folder, job.job_id, 0).result_pickle.exists() else None
        detail = f"raised:\n{error[1]}" if error and error[0] != "success" else f"log tail:\n{log_tail(job.log)}"
        raise JobFailed(f"Slurm job {job.job_id} is {seen.raw}; {detail}")
    results = []
    for t in range(int(job.info.get("tasks", 1))):
        paths = JobPaths(folder, job.job_id, t)
        for _ in range(20):             # the file may appear just after the state changes
            if paths.result_pickle.exists():
                break
            time.sleep(0.1)
        if not paths.result_pickle.exists():
            raise JobFailed(f"Slurm job {job.job_id} is {seen.raw} without a result for task {t}; "
                            f"log tail:\n{log_tail(paths.stdout)}")
        outcome, value = pickle_load(paths.result_pickle)
        if outcome != "success":
            raise JobFailed(f"Slurm job {job.job_id} task {t} raised:\n{value}")
        results.append(value)
    return results


# --------------------------------------------------------------------------- booking (dry run)

#: submitit's ``max_num_timeout`` for every job: it requeues a checkpointable job after each
#: of its first MAX_TIMEOUTS time-limit hits (``JobEnvironment.checkpoint_and_try_requeue``
#: counts down from it and requeues while the count is >= 0), and the next hit ends the run,
#: marked ``timed_out``: a run gets at most MAX_TIMEOUTS + 1 jobs of ``time_min`` each.
MAX_TIMEOUTS = 3


def time_limit_jobs(wall_seconds: float, limit_seconds: float, redo_seconds: float) -> int | None:
    """Jobs of ``limit_seconds`` each that ``wall_seconds`` of training need when every requeue
    trains again up to ``redo_seconds`` (the steps since the last checkpoint): the least n with
    n limit - (n - 1) redo >= wall.  None when a job is no longer than the redo (no progress)."""
    if wall_seconds <= limit_seconds:
        return 1
    if limit_seconds <= redo_seconds:
        return None
    return max(1, -int(-(wall_seconds - redo_seconds) // (limit_seconds - redo_seconds)))


def reservation(recipe, booking):
    """What to book for a Slurm run (:func:`scalectl.job.booking.reserve`): the allocation's GPUs
    (nodes x ``gpus_per_node``; the recipe's devices when it asks for none) for the jobs its
    wall-clock takes at ``launcher.slurm.time_min`` (:func:`time_limit_jobs`), each requeue
    training again up to ``booking.redo_seconds``.  None when the wall-clock is not known or no
    number of jobs finishes it."""
    from scalectl.job.booking import reserve

    s = recipe.launcher.slurm
    limit = s.time_min * 60.0
    if booking.wall_seconds is None:
        return None
    jobs = time_limit_jobs(booking.wall_seconds, limit, booking.redo_seconds)
    if jobs is None:
        return None
    devices = s.nodes * s.gpus_per_node if s.gpus_per_node else recipe.hardware.devices
    return reserve(booking, devices, jobs, limit)


def booking_lines(recipe, wall_seconds: float | None, redo_seconds: float) -> list[str]:
    """What the dry run says about the Slurm booking: the jobs the wall-clock needs at
    ``launcher.slurm.time_min`` and whether they fit the ``timed_out`` rule (:data:`MAX_TIMEOUTS`),
    and a warning for each sbatch option the cluster may need that the script lacks."""
    from scalectl.display import duration_text

    s = recipe.launcher.slurm
    limit = s.time_min * 60.0
    most = MAX_TIMEOUTS + 1
    lines = []
    if wall_seconds is not None:
        jobs = time_limit_jobs(wall_seconds, limit, redo_seconds)
        head = (f"time limit: launcher.slurm.time_min = {s.time_min} ({duration_text(limit)}) per job: about "
                f"{duration_text(wall_seconds)}")
        redo = (f"; each requeue trains again up to checkpoint.every_steps = {recipe.checkpoint.every_steps} steps "
                f"({duration_text(redo_seconds)})")
        rule = (f"submitit requeues a run after each of its first {MAX_TIMEOUTS} time-limit hits and marks it "
                f"timed_out at hit {most} (at most {most} jobs, {duration_text(most * limit)})")
        if jobs is None:
            lines.append(f"warning: {head} cannot finish: a job is no longer than the steps a requeue trains again"
                         f"{redo}; raise launcher.slurm.time_min or lower checkpoint.every_steps")
        elif jobs == 1:
            lines.append(f"{head} fit one job")
        elif jobs <= most:
            lines.append(f"{head} need {jobs} jobs, the first and {jobs - 1} requeue(s){redo}; within the rule: {rule}")
        else:
            lines.append(f"warning: {head} need {jobs} jobs{redo}: more than the rule allows ({rule}); raise "
                         f"launcher.slurm.time_min, or continue with `scalectl run --resume` after it stops")
    for key, what in (("partition", "the job goes to the cluster's default partition, which may hold no GPU nodes"),
                      ("account", "the job is charged to your default account, if the cluster gives you one")):
        if getattr(s, key) is None:
            lines.append(f"warning: the sbatch script has no --{key} (launcher.slurm.{key} is unset): {what}")
    return lines
