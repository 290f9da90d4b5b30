"""A reward function of the user's, called in processes of its own under a time bound.

Each process that scores keeps worker processes for the function (:class:`~scalectl.rl.reward.workers.WorkerPool`):
a fresh interpreter that imports the function once (:func:`serve_function`; with this
process's ``sys.path``, the current folder included) and then answers one request at a time
over a pipe, the completion, gold answer and fields going as one JSON line (values JSON
cannot hold, such as dates, as their ``str``): one completion against one gold answer
(:func:`call_function`; the ``scalectl`` and ``verl`` conventions), or the completions of one
prompt in one call (:func:`call_batch`; ``trl``), as :mod:`scalectl.rl.reward.conventions`
calls each.  A call that overruns ``timeout`` seconds
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
from scalectl.recipe.reward_function import import_reward
from scalectl.rl.reward.conventions import Caller
from scalectl.rl.reward.score import RewardFunctionError, Score
from scalectl.rl.reward.workers import CheckTimeout, WorkerPool, WorkerRefused

_POOLS: dict[tuple[str, str | None], WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def serve_function(name: str, convention: str | None = None) -> None:
    """Body of a reward-function process: import ``name`` (of ``convention``, or the one its
    signature shows: :func:`~scalectl.recipe.reward_function.import_reward`), print ``ready``
    (or the import error, one line), then answer JSON request lines on stdin (:func:`answer`)
    with JSON lines on stdout, until stdin closes.

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
        caller = Caller(*import_reward(name, convention))
    except UserError as exc:
        out.write(" ".join(str(exc).split()) + "\n")
        out.flush()
        return
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        out.write(json.dumps(answer(caller, json.loads(line))) + "\n")
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


def answer(caller: Caller, request: dict) -> dict:
    """The reply to one request of :func:`serve_function`:

    * ``{"convention": true}``: ``{"convention": NAME}``, the function's convention;
    * ``{"one": [completion, gold, fields, data_source]}``: ``{"reward": float, "correct": bool}``
      (:meth:`~scalectl.rl.reward.conventions.Caller.one`);
    * ``{"batch": [prompt, completions, completion_ids, fields]}``: ``{"scores": [[reward,
      correct], ...]}`` (:meth:`~scalectl.rl.reward.conventions.Caller.batch`);

    or ``{"error": what went wrong}``: an exception, with the line it came from, or a value
    that is not a reward (:func:`~scalectl.rl.reward.score.as_score`), naming the value (also
    when reading it raised: the worker lives on)."""
    import traceback

    if "convention" in request:
        return {"convention": caller.convention}
    try:
        value = caller.batch(*request["batch"]) if "batch" in request else caller.one(*request["one"])
    except Exception as exc:  # noqa: BLE001 - the user's code: reported, naming the function
        return {"error": _raised(exc, traceback.extract_tb(exc.__traceback__))}
    try:
        if "batch" in request:
            return {"scores": [[s.reward, s.correct] for s in caller.scores(value, len(request["batch"][1]))]}
        score = caller.score(value)
    except (TypeError, ValueError) as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a value whose own methods raise: reported, not a dead worker
        return {"error": f"returned {type(value).__name__} {_repr(value)}, which could not be read as a reward "
                         f"({type(exc).__name__}: {exc})"}
    return {"reward": score.reward, "correct": score.correct}


def _repr(value) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - the user's __repr__
        return "(its repr raised)"
    return text if len(text) <= 60 else text[:60] + "..."


def _raised(exc: Exception, frames) -> str:
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"raised {type(exc).__name__}: {exc}{where}"


def _pool(name: str, convention: str | None) -> WorkerPool:
    with _POOLS_LOCK:
        if (name, convention) not in _POOLS:
            _POOLS[name, convention] = pool = WorkerPool(
                f"from scalectl.rl.reward.calls import serve_function; serve_function({name!r}, {convention!r})")
            atexit.register(pool.close)
        return _POOLS[name, convention]


def close_workers() -> None:
    """Stop the idle worker processes of every function (the next call starts new ones, with
    the environment of that moment)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
    for pool in pools:
        pool.close()


def _about(completion: str, gold: str | None = None) -> str:
    shown = completion if len(completion) <= 80 else completion[:80] + "..."
    return f"the completion {shown!r}" + (f" (gold {gold!r})" if gold is not None else "")


@functools.lru_cache(maxsize=None)
def _here(name: str, convention: str | None) -> Caller:
    return Caller(*import_reward(name, convention))


def _key(name: str, convention: str | None) -> str:
    return f"reward.function = {name!r}" + (f" (reward.convention = {convention!r})" if convention else "")


def _ask(name: str, convention: str | None, request: dict, timeout: float, about: str, bound: str = "") -> dict:
    """The reply of a worker of ``name`` to ``request`` (:func:`answer`), at most ``timeout``
    seconds; in this process where no worker can be started.

    Raises:
        RewardFunctionError: no reply in time (the worker is killed), the worker exited, or it
            could not import the function; the message names it, ``about`` (what was scored) and
            ``bound`` (what ``timeout`` is: ``reward.timeout_s = 5 s``).
    """
    key = _key(name, convention)
    line = json.dumps(request, default=str)
    pool = _pool(name, convention)
    if pool.unavailable is None:
        try:
            return json.loads(pool.run(line, timeout))
        except CheckTimeout:
            raise RewardFunctionError(f"{key} did not return within {bound or f'{timeout:g} s'} on {about}; "
                                      "its process was killed") from None
        except EOFError as exc:
            raise RewardFunctionError(f"{key}: {exc} while scoring {about}") from None
        except WorkerRefused as exc:
            raise RewardFunctionError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - no process can be started here
            pool.unavailable = f"{type(exc).__name__}: {exc}"
            logging.getLogger(__name__).warning(
                "%s runs in-process, without a time bound: cannot start a process for it (%s)", key, pool.unavailable)
    try:
        caller = _here(name, convention)
    except UserError as exc:
        raise RewardFunctionError(str(exc)) from None
    return answer(caller, json.loads(line))


_CONVENTIONS: dict[tuple[str, str | None], str] = {}


def function_convention(name: str, convention: str | None, *, timeout: float) -> str:
    """The calling convention of ``name``: ``convention`` (``reward.convention``) when set, else
    the one its worker recognised from its signature (asked once per process).

    Raises:
        RewardFunctionError: the function cannot be imported, or fits no convention or several
            (see :func:`~scalectl.recipe.reward_function.convention_of`).
    """
    if convention is not None:
        return convention
    if (name, None) not in _CONVENTIONS:
        reply = _ask(name, None, {"convention": True}, max(timeout, 60.0), "its signature")
        _CONVENTIONS[name, None] = reply["convention"]
    return _CONVENTIONS[name, None]


def call_function(name: str, completion: str, gold: str, fields: dict, *, timeout: float,
                  convention: str | None = None, data_source: str = "") -> Score:
    """The :class:`~scalectl.rl.reward.score.Score` of one completion against one gold answer
    by ``name`` (of the ``scalectl`` or ``verl`` convention:
    :meth:`~scalectl.rl.reward.conventions.Caller.one`), called in a worker process, at most
    ``timeout`` seconds.

    Raises:
        RewardFunctionError: the function cannot be imported, raised, overran ``timeout``
            (its process was killed), made its process exit, or returned something that is
            not a reward; the message names it and the completion.
    """
    about = _about(completion, gold)
    reply = _ask(name, convention, {"one": [completion, gold, fields, data_source]}, timeout, about,
                 f"reward.timeout_s = {timeout:g} s")
    if "error" in reply:
        raise RewardFunctionError(f"{_key(name, convention)} {reply['error']}, on {about}")
    return Score(float(reply["reward"]), bool(reply["correct"]))


def call_batch(name: str, prompt: str, completions: list[str], completion_ids: list[list[int]], fields: dict, *,
               timeout: float, convention: str | None = None) -> list[Score]:
    """The Scores of the completions of one prompt by ``name`` (of the ``trl`` convention:
    :meth:`~scalectl.rl.reward.conventions.Caller.batch`), in one call in a worker process, at
    most ``timeout`` seconds per completion (``len(completions) x timeout`` in all).

    Raises:
        RewardFunctionError: as :func:`call_function`; the message names the batch by its
            prompt and first completion.
    """
    if not completions:
        return []
    about = f"a batch of {len(completions)} completions of the prompt {prompt[:60]!r} (the first: " \
            f"{_about(completions[0])[len('the completion '):]})"
    reply = _ask(name, convention, {"batch": [prompt, completions, completion_ids, fields]},
                 timeout * len(completions), about, f"{len(completions)} x reward.timeout_s = {timeout:g} s")
    if "error" in reply:
        raise RewardFunctionError(f"{_key(name, convention)} {reply['error']}, on {about}")
    return [Score(float(r), bool(c)) for r, c in reply["scores"]]
