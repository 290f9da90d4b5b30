"""The processes of a job in processes (``pipeline``; ``sync`` and ``ppo_off_policy`` beyond
1 generator + 1 trainer) on one machine: spawn, relay progress, stop together.

:func:`supervise` starts ``generators`` generator processes and ``trainers`` trainer
processes (the first trainer rank leads, the others follow it) (``python -m scalectl.rl.processes.supervise SPEC``, with the environment
:func:`scalectl.rl.transport.roles.local_task_env` gives task ``rank``), each with
one thread, its output in ``RUN_DIR/logs/pipeline-ROLE-RANK.log`` and its
progress (steps, evaluation points, messages) sent back as JSON lines on a
pipe and handed to the run's reporter.  ``RUN_DIR/pipeline/tasks.json`` lists
the processes.

Stopping:

* a process that fails (an error, a signal) stops the job: the others get
  SIGTERM (the trainer checkpoints), and :class:`ProcessFailed` names the
  process and its error; a process that failed because another made no progress
  (:class:`~scalectl.rl.transport.board.TaskStuck`) or because another's heartbeat stood still
  (a :class:`~scalectl.rl.transport.board.TaskLost` found by watching: a process stopped by a
  signal) has that one killed at once (it answers no signal it could act on), and its error,
  which names that one, is the job's;
* Ctrl-C or SIGTERM on the supervisor (``scalectl cancel``) is passed to
  every process as SIGINT: the trainer finishes its step, checkpoints and
  stops the generators; the supervisor then raises ``KeyboardInterrupt``;
* a process still alive ``grace_s`` seconds after being told to stop is
  killed, and each process gets SIGTERM if the supervisor dies
  (``PR_SET_PDEATHSIG``), so none is left behind.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from scalectl.rl.processes.bodies import run_role
from scalectl.rl.transport.roles import detect, first_gpu, free_port, local_task_env
from scalectl.rl.transport.board import LOG_ENV, TaskLost, TaskStuck, is_lost_peer


class ProcessFailed(RuntimeError):
    """A generator or trainer process of a job in processes failed (its name is historical:
    every async mode's processes raise it)."""


class EventReporter:
    """A :class:`scalectl.rl.loop.Reporter` writing JSON lines to a pipe (a child's end)."""

    def __init__(self, fd: int):
        self.out = os.fdopen(fd, "w", buffering=1)

    def emit(self, event: str, **data) -> None:
        try:
            self.out.write(json.dumps({"event": event, **data}, default=str) + "\n")
        except (BrokenPipeError, ValueError):   # the supervisor is gone; PR_SET_PDEATHSIG stops us
            pass

    def start(self, total_steps, first_step):
        self.emit("start", total_steps=total_steps, first_step=first_step)

    def step(self, step, metrics):
        self.emit("step", step=step, metrics=metrics)

    def eval(self, step, point):
        self.emit("eval", step=step, point=point)

    def log(self, message):
        self.emit("log", message=str(message))

    def stop(self):
        pass


def _die_with_parent(parent: int) -> None:
    """SIGTERM this process when its parent dies (Linux), and exit now if it already has."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))   # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent:
        sys.exit(1)


def child_main(argv: list[str] | None = None) -> int:
    """Body of one spawned task: run its role, report the outcome on the events pipe."""
    parser = argparse.ArgumentParser(prog="python -m scalectl.rl.processes.supervise")
    parser.add_argument("spec", type=Path)
    parser.add_argument("--events-fd", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent(int(os.environ.get("SCALECTL_PARENT_PID", os.getppid())))
    reporter = EventReporter(args.events_fd)
    spec = pickle.loads(args.spec.read_bytes())
    hw = spec.recipe["hardware"]
    task = detect(hw["generators"], hw["trainers"], gpus_per_generator=hw.get("gpus_per_generator", 1))
    try:
        result = run_role(spec, task, reporter)
    except KeyboardInterrupt:
        reporter.emit("interrupted")
        return 130
    except BaseException as exc:  # noqa: BLE001 - reported, then the exit status says it failed
        traceback.print_exc()
        reporter.emit("error", message="".join(traceback.format_exception_only(exc)).strip(),
                      secondary=_lost_peer(exc), stuck=_found_still(exc))
        return 1
    reporter.emit("done", result=result)
    return 0


def _found_still(exc: BaseException) -> int | None:
    """The rank of the task ``exc`` names as found still by watching its beats (stuck, or its
    heartbeat stood still: alive, maybe stopped by a signal), which the supervisor kills; None
    otherwise (a lost connection: that task is gone already)."""
    if isinstance(exc, TaskStuck) or (isinstance(exc, TaskLost) and exc.detail):
        return exc.card.rank
    return None


def _lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` only says that another task went away (a generator or the leader stopped
    answering, a trainers' collective whose peer closed): the other task's failure is the cause."""
    return is_lost_peer(exc)


def _read_events(rank: int, fd: int, events: queue.Queue) -> None:
    with os.fdopen(fd) as fh:
        for line in fh:
            try:
                events.put((rank, json.loads(line)))
            except json.JSONDecodeError:
                events.put((rank, {"event": "log", "message": line.rstrip()}))
    events.put((rank, None))


def _describe(task: dict, rc: int, error: dict | None, mode: str = "pipeline") -> str:
    what = f"{mode} {task['role']} process (rank {task['rank']}, pid {task['pid']})"
    if rc < 0:
        how = f"was killed by signal {signal.Signals(-rc).name}"
    elif error is not None:
        how = f"failed: {error['message']}"
    else:
        how = f"exited with status {rc}"
    return f"{what} {how} (log: {task['log']})"


def _spawn(spec_path: Path, rank: int, world: int, port: int, log: Path, events: queue.Queue,
           local_rank: int | None = None) -> subprocess.Popen:
    """Start task ``rank`` (``python -m scalectl.rl.processes.supervise SPEC``), its output in
    ``log``, its events read into ``events`` by a thread of its own; ``local_rank``: its first GPU
    (default ``rank``)."""
    r, w = os.pipe()
    env = {**os.environ, **local_task_env(rank, world, port, local_rank=local_rank),
           "SCALECTL_PARENT_PID": str(os.getpid()),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", LOG_ENV: str(log)}
    with log.open("ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "scalectl.rl.processes.supervise", str(spec_path),
                                 "--events-fd", str(w)], pass_fds=(w,), stdin=subprocess.DEVNULL,
                                stdout=fh, stderr=subprocess.STDOUT, env=env)
    os.close(w)
    threading.Thread(target=_read_events, args=(rank, r, events), daemon=True).start()
    return proc


class _Processes:
    """The spawned processes of one job: their events relayed to the reporter, their exits, and
    the signals that stop them together."""

    def __init__(self, procs: list, tasks: list[dict], events: queue.Queue, leader: int, reporter,
                 grace_s: float):
        self.procs, self.tasks, self.events, self.leader = procs, tasks, events, leader
        self.reporter, self.grace_s = reporter, grace_s
        self.result, self.errors, self.exits = None, {}, []
        self.interrupted, self.deadline = False, None
        self.stuck: set[int] = set()         # ranks killed because another found them stuck

    def handle(self, rank: int, ev: dict | None) -> None:
        """Hand one event of process ``rank`` to the reporter (or keep its result or error)."""
        if ev is None:
            return
        kind, reporter = ev["event"], self.reporter
        if kind == "start":
            reporter.start(ev["total_steps"], ev["first_step"])
        elif kind == "step":
            reporter.step(ev["step"], ev["metrics"])
        elif kind == "eval":
            reporter.eval(ev["step"], ev["point"])
        elif kind == "log":
            reporter.log(ev["message"])
        elif kind == "done" and rank == self.leader:
            self.result = ev["result"]
        elif kind == "error":
            self.errors[rank] = ev
            stuck = ev.get("stuck")
            if stuck is not None and 0 <= stuck < len(self.procs) and self.procs[stuck].poll() is None:
                self.procs[stuck].kill()                   # it made no progress: nothing to wait for
                self.stuck.add(stuck)

    def signal_all(self, sig) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    def wait_all(self) -> None:
        """Relay events until every process has exited; one that fails stops the others (SIGTERM,
        then SIGKILL after ``grace_s``)."""
        # every process polled each turn (``any`` over a generator would stop at the first alive one
        # and never see a later one exit: a stuck first generator would hide the trainer's failure)
        while [p.poll() for p in self.procs].count(None) or not self.events.empty():
            try:
                self.handle(*self.events.get(timeout=0.1))
            except queue.Empty:
                pass
            for rank, p in enumerate(self.procs):
                if p.returncode is not None and rank not in dict(self.exits):
                    self.exits.append((rank, p.returncode))
                    if p.returncode not in (0, 130) and self.deadline is None:
                        self.signal_all(signal.SIGTERM)           # one failed: the others checkpoint and stop
                        self.deadline = time.monotonic() + self.grace_s
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.signal_all(signal.SIGKILL)

    def wait(self) -> None:
        """:meth:`wait_all`, passing a Ctrl-C (or SIGTERM) on to every process as SIGINT."""
        while True:
            try:
                self.wait_all()
                return
            except KeyboardInterrupt:                        # wherever it lands: pass it on, keep waiting
                self.interrupted = True
                self.signal_all(signal.SIGINT)
                self.deadline = self.deadline or time.monotonic() + self.grace_s

    def reap(self) -> None:
        """Kill what is left, collect every exit status and the last errors, stop the reporter."""
        self.signal_all(signal.SIGKILL)
        for rank, p in enumerate(self.procs):
            p.wait()
            if rank not in dict(self.exits):
                self.exits.append((rank, p.returncode))
        while not self.events.empty():
            rank, ev = self.events.get()
            if ev is not None and ev["event"] == "error":
                self.errors[rank] = ev
        self.reporter.stop()

    def outcome(self, mode: str) -> dict:
        """The first trainer's summary.

        Raises:
            ProcessFailed: a process failed (the first one whose error is not only another's
                loss), or the first trainer ended without a result; KeyboardInterrupt: interrupted.
        """
        failed = [(rank, rc) for rank, rc in self.exits if rc not in (0, 130)]
        if failed:
            # the cause: not a process that only lost another, nor a stuck one killed here (the
            # process that found it stuck names it); else the process that found one still
            finders = [(r, rc) for r, rc in failed if self.errors.get(r, {}).get("stuck") in self.stuck]
            primary = [(r, rc) for r, rc in failed if not self.errors.get(r, {}).get("secondary")
                       and r not in self.stuck] or finders or failed
            rank, rc = primary[0]
            raise ProcessFailed(_describe(self.tasks[rank], rc, self.errors.get(rank), mode))
        if self.interrupted or any(rc == 130 for _, rc in self.exits):
            raise KeyboardInterrupt
        if self.result is None:
            raise ProcessFailed(f"the first trainer process ended without a result "
                                f"(log: {self.tasks[self.leader]['log']})")
        return self.result


def supervise(spec, generators: int, reporter, grace_s: float = 120.0, trainers: int = 1) -> dict:
    """Run a job in processes as local processes (see the module docstring) and return the trainer's summary.

    Args:
        spec: the job's :class:`~scalectl.rl.processes.bodies.ProcessSpec` (its ``schedule`` names
            the mode in messages).
        generators, trainers: process counts; ranks ``0 .. generators-1`` generate.
        reporter: receives every process's progress.
        grace_s: seconds a process told to stop has before it is killed.

    Raises:
        ProcessFailed: a process failed; KeyboardInterrupt: interrupted (the trainer checkpointed).
    """
    run_dir = Path(spec.run_dir)
    folder, logs = run_dir / "pipeline", run_dir / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "spec.pkl"
    spec_path.write_bytes(pickle.dumps(spec))
    world, port, leader = generators + trainers, free_port(), generators
    events: queue.Queue = queue.Queue()
    tasks, procs = [], []
    for rank in range(world):
        role = "generator" if rank < generators else "trainer"    # as scalectl.rl.transport.roles.assign_role
        log = logs / f"pipeline-{role}-{rank}.log"
        gpus = spec.recipe["hardware"].get("gpus_per_generator", 1)      # a generator's GPUs, from g T on
        procs.append(_spawn(spec_path, rank, world, port, log, events, first_gpu(rank, generators, gpus)))
        tasks.append({"rank": rank, "role": role, "pid": procs[-1].pid, "log": str(log)})
    (folder / "tasks.json").write_text(json.dumps({"supervisor": os.getpid(), "tasks": tasks}, indent=2))
    reporter.log(f"{generators} generator process(es) and {trainers} trainer process(es) started "
                 f"({spec.schedule.describe()}; logs in {logs})")
    job = _Processes(procs, tasks, events, leader, reporter, grace_s)
    try:
        job.wait()
    finally:
        job.reap()
    return job.outcome(spec.schedule.mode.name)


if __name__ == "__main__":
    code = child_main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)      # no interpreter teardown: a receive still pending after a failure would abort it
