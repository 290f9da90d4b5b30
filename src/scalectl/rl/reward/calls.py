"""A reward function of the user's, called in processes of its own under a time bound.

Each process that scores keeps worker processes for the function (:class:`~scalectl.rl.reward.workers.WorkerPool`):
a fresh interpreter that imports the function once (:func:`serve_function`; with this
process's ``sys.path``, the current folder included) and then answers one call at a time
over a pipe, the completion, gold answer and fields going as one JSON line (values JSON
cannot hold, such as dates, as their ``str``).  A call that overruns ``timeout`` seconds
kills its worker and raises :class:`~scalectl.rl.reward.score.RewardFunctionError`, as do a
function that cannot be imported, raises, returns what is not a reward
(:func:`~scalectl.rl.reward.score.as_score`) or makes its process exit; every message names
the function and the completion.  A worker keeps what the function keeps between calls
(a model it loaded, a cache) until it is killed; threads that score at once get a worker
each.  Where no process can be started, calls run in this process without a time bound
(a warning says so once).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import threading

from scalectl.errors import UserError
from scalectl.recipe.reward_function import import_function
from scalectl.rl.reward.score import RewardFunctionError, Score, as_score
from scalectl.rl.reward.workers import CheckTimeout, WorkerPool, WorkerRefused

_POOLS: dict[str, WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def serve_function(name: str) -> None:
    """Body of a reward-function process: import ``name``, print ``ready`` (or the import
    error, one line), then read ``[completion, gold, fields]`` JSON lines on stdin and write
    ``{"reward", "correct"}`` or ``{"error"}`` JSON lines on stdout, until stdin closes.

    SIGINT is ignored (Ctrl-C stops the run through its own processes, which then close
    stdin), the process exits within a second of its parent (a watchdog thread: also while
    the function hangs), and what the function prints goes to stderr (the scoring process's
    log)."""
    import os
    import signal
    import sys

    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True, name="parent-watchdog").start()
    try:
        function = import_function(name)
    except UserError as exc:
        out.write(" ".join(str(exc).split()) + "\n")
        out.flush()
        return
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        completion, gold, fields = json.loads(line)
        out.write(json.dumps(answer(function, completion, gold, fields)) + "\n")
        out.flush()


def _exit_with(parent: int) -> None:
    """Exit this process once ``parent`` is no longer its parent (it died).  Not
    ``PR_SET_PDEATHSIG``: that fires when the parent's *thread* that started the process
    ends, and workers are started by threads that end (a background evaluation's)."""
    import os
    import time

    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def answer(function, completion: str, gold: str, fields: dict) -> dict:
    """``function(completion, gold, fields)`` as a reply: ``{"reward": float, "correct": bool}``,
    or ``{"error": what went wrong}`` (an exception, with the line it came from, or a value
    :func:`~scalectl.rl.reward.score.as_score` refuses)."""
    import traceback

    try:
        value = function(completion, gold, fields)
    except Exception as exc:  # noqa: BLE001 - the user's code: reported, naming the function
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        return {"error": f"raised {type(exc).__name__}: {exc}{where}"}
    try:
        score = as_score(value)
    except (TypeError, ValueError) as exc:
        return {"error": str(exc)}
    return {"reward": score.reward, "correct": score.correct}


def _pool(name: str) -> WorkerPool:
    with _POOLS_LOCK:
        if name not in _POOLS:
            _POOLS[name] = WorkerPool(f"from scalectl.rl.reward.calls import serve_function; serve_function({name!r})")
            atexit.register(_POOLS[name].close)
        return _POOLS[name]


def close_workers() -> None:
    """Stop the idle worker processes of every function (the next call starts new ones, with
    the environment of that moment)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
    for pool in pools:
        pool.close()


def _about(completion: str, gold: str) -> str:
    shown = completion if len(completion) <= 80 else completion[:80] + "..."
    return f"the completion {shown!r} (gold {gold!r})"


@functools.lru_cache(maxsize=None)
def _here(name: str):
    return import_function(name)


def call_function(name: str, completion: str, gold: str, fields: dict, *, timeout: float) -> Score:
    """The :class:`~scalectl.rl.reward.score.Score` of ``name(completion, gold, fields)``,
    called in a worker process, at most ``timeout`` seconds.

    Raises:
        RewardFunctionError: the function cannot be imported, raised, overran ``timeout``
            (its process was killed), made its process exit, or returned something that is
            not a reward; the message names it and the completion.
    """
    key = f"reward.function = {name!r}"
    request = json.dumps([completion, gold, fields], default=str)
    pool = _pool(name)
    if pool.unavailable is None:
        try:
            reply = json.loads(pool.run(request, timeout))
        except CheckTimeout:
            raise RewardFunctionError(f"{key} did not return within reward.timeout_s = {timeout:g} s on "
                                      f"{_about(completion, gold)}; its process was killed") from None
        except EOFError as exc:
            raise RewardFunctionError(f"{key}: {exc} while scoring {_about(completion, gold)}") from None
        except WorkerRefused as exc:
            raise RewardFunctionError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - no process can be started here
            pool.unavailable = f"{type(exc).__name__}: {exc}"
            logging.getLogger(__name__).warning(
                "%s runs in-process, without a time bound: cannot start a process for it (%s)", key, pool.unavailable)
        else:
            return _score(key, reply, completion, gold)
    try:
        function = _here(name)
    except UserError as exc:
        raise RewardFunctionError(str(exc)) from None
    return _score(key, answer(function, *json.loads(request)), completion, gold)


def _score(key: str, reply: dict, completion: str, gold: str) -> Score:
    if "error" in reply:
        raise RewardFunctionError(f"{key} {reply['error']}, on {_about(completion, gold)}")
    return Score(float(reply["reward"]), bool(reply["correct"]))
