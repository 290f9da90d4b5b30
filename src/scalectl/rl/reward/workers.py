"""Checker processes: math-verify (and reward functions) under a time bound, safe in threads.

math-verify's own timeouts use ``signal.alarm`` (main thread only), so they are off and
every math-verify call (:func:`scalectl.rl.reward.mathverify.verify_here`) runs in a
checker process instead: a fresh interpreter (nothing of the caller is re-run or inherited)
that answers one comparison at a time over a pipe.  A call that takes longer than its
timeout raises :class:`CheckTimeout` and its process is killed (``(x+1)^{1000}`` against
``x^{1000}`` takes ~9 s in sympy; ``\\sum_{k=1}^{9999}k^{9999}`` does not return); the next
check starts a new one (~1 s).  Where no process can be started (a sandbox without
``fork``), checks run in this process without a time bound and a warning is logged once.

:class:`WorkerPool` serves any body of that kind: a process that prints ``ready`` (or one
line saying why not, :class:`WorkerRefused`), then answers one JSON request line with one
line; :mod:`scalectl.rl.reward.calls` runs the user's reward functions in such processes.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading

from scalectl.rl.reward.mathverify import Verdict, verify_here

#: Seconds a new checker process may take to start (imports math-verify, sympy).
WORKER_START_TIMEOUT_S = 120.0
#: Idle checker processes kept for reuse (more start while more threads check at once).
MAX_IDLE_WORKERS = 4


def serve_checks() -> None:
    """Body of a checker process (``python -c "from scalectl.rl.reward.workers import serve_checks;
    serve_checks()"``): reads ``[gold, answer]`` JSON lines on stdin, writes a
    ``[correct, error]`` JSON line for each on stdout (:class:`~scalectl.rl.reward.mathverify.Verdict`),
    until stdin closes.  Stray output of the libraries goes to stderr."""
    import json
    import os
    import sys

    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    verify_here("1", "1.0")  # load the LaTeX parser before reporting ready
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            gold, answer = json.loads(line)
            verdict = verify_here(str(gold), str(answer))
        except ValueError as exc:
            verdict = Verdict(False, f"a request the checker process could not read: {exc}")
        out.write(json.dumps(list(verdict)) + "\n")
        out.flush()


class CheckTimeout(Exception):
    """A checker process did not answer in time, or died (never cached)."""


class WorkerRefused(Exception):
    """A worker process started but said, instead of ``ready``, why it cannot serve (e.g. a
    reward function that cannot be imported); the message is its line."""


#: The body of a math-verify checker process.
CHECKS_BODY = "from scalectl.rl.reward.workers import serve_checks; serve_checks()"


class _Worker:
    """One worker process (a fresh interpreter running ``body``, e.g. :func:`serve_checks`)."""

    def __init__(self, body: str = CHECKS_BODY):
        """Start the process and wait until it is ready (has loaded math-verify, say).

        The process gets this one's ``sys.path`` as its ``PYTHONPATH`` and stderr.

        Raises:
            WorkerRefused: its first line is not ``ready`` (the line is the message).
            RuntimeError: the process cannot be started, exits, or is not ready within
                :data:`WORKER_START_TIMEOUT_S` seconds.
        """
        import os
        import subprocess
        import sys

        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", body], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
        except OSError as exc:
            raise RuntimeError(f"cannot start a checker process: {exc}") from exc
        try:
            first = self._read(WORKER_START_TIMEOUT_S)
        except (CheckTimeout, EOFError):
            first = None
        if first != "ready":
            self.stop()
            if first:
                raise WorkerRefused(first)
            raise RuntimeError(f"checker process did not start (or not within {WORKER_START_TIMEOUT_S} s)")

    def _read(self, timeout: float) -> str:
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise CheckTimeout
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError("checker process exited")
        return line.strip()

    def ask(self, request: str, timeout: float) -> str:
        """Send one request line, return the answer line; CheckTimeout after ``timeout`` s."""
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Kill the process (it may be stuck in sympy) and reap it."""
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class WorkerPool:
    """Worker processes running ``body``, one request at a time each; a worker that overruns
    its timeout is killed and a new one started on demand (~1 s: a fresh interpreter
    imports math-verify).  Thread-safe: each thread takes an idle worker or starts one."""

    def __init__(self, body: str = CHECKS_BODY):
        import os

        self.body = body
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.unavailable: str | None = None   # why workers cannot start (then: in-process)

    def run(self, request: str, timeout: float) -> str:
        """The answer line of a worker to one request line.

        Raises:
            CheckTimeout: no answer within ``timeout`` seconds (the worker is killed).
            EOFError: the worker exited while answering (the message gives its exit status).
            WorkerRefused, RuntimeError: no worker could be started (see :class:`_Worker`).
        """
        import os

        if self._pid != os.getpid():   # a forked child: the parent's workers are not ours
            self._idle, self._lock, self._pid = [], threading.Lock(), os.getpid()
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is not None and not worker.alive():
            worker.stop()          # died while idle
            worker = None
        if worker is None:
            worker = _Worker(self.body)
        try:
            result = worker.ask(request, timeout)
        except (EOFError, BrokenPipeError):
            worker.stop()          # died while answering
            raise EOFError(f"the process exited with status {worker.proc.returncode}") from None
        except BaseException:
            worker.stop()          # overran or was interrupted
            raise
        with self._lock:
            if len(self._idle) < MAX_IDLE_WORKERS:
                self._idle.append(worker)
                worker = None
        if worker is not None:
            worker.stop()
        return result

    def close(self) -> None:
        """Stop the idle workers (the next check starts a new one)."""
        import os

        if self._pid != os.getpid():
            return
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()


_POOL = WorkerPool()
atexit.register(_POOL.close)


@functools.lru_cache(maxsize=65536)
def verify_bounded(gold: str, answer: str, timeout: float) -> Verdict:
    """:func:`~scalectl.rl.reward.mathverify.verify_here` in a checker process, at most
    ``timeout`` seconds (cached per arguments; a timeout is not cached): its
    :class:`~scalectl.rl.reward.mathverify.Verdict`.

    Raises:
        CheckTimeout: the check overran ``timeout`` (its process was killed) or its process died.
    """
    if _POOL.unavailable is None:
        import json

        try:
            correct, error = json.loads(_POOL.run(json.dumps([gold, answer]), timeout))
            return Verdict(bool(correct), error)
        except (CheckTimeout, EOFError, OSError):
            raise CheckTimeout from None
        except Exception as exc:  # noqa: BLE001 - no process can be started here
            _POOL.unavailable = f"{type(exc).__name__}: {exc}"
            logging.getLogger(__name__).warning(
                "answer checking runs in-process, without a time bound: cannot start a checker process (%s)",
                _POOL.unavailable)
    return verify_here(gold, answer)
