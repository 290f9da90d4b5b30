"""The answer checker and the reward: +1 for a correct final answer, -1 otherwise.

The final answer is the content of the LAST ``\\boxed{...}`` of the completion
(braces balanced).  It is correct when it equals the gold answer as a string
(the fast path, ~1 us) or when math-verify says so: ``verify(parse(gold), parse(answer))``
(Hugging Face math-verify, the checker of record for every non-identical string).

Bounded time, safe in threads: math-verify's own timeouts use ``signal.alarm``
(main thread only), so they are turned off (``parsing_timeout=None``,
``timeout_seconds=None``) and time is bounded here instead, in two layers:

* a guard: an answer longer than :data:`MAX_ANSWER_CHARS`, with a nested exponent
  (``10^{10^{10}}`` does not return) or with an integer of more than
  :data:`MAX_EXPONENT_DIGITS` digits in an exponent or a factorial
  (``2^{100000000}``: > 1 s) scores False without being parsed;
* checker processes: every math-verify call runs in one (a fresh interpreter, so
  nothing of the caller is re-run or inherited), and a call that takes longer than
  :data:`CHECK_TIMEOUT_S` seconds scores False and its process is killed (``(x+1)^{1000}`` against ``x^{1000}`` passes the guard and takes ~9 s in
  sympy; ``\\sum_{k=1}^{9999}k^{9999}`` does not return).

Both sides are first normalised the same way (:func:`canonical_answer`): surrounding
whitespace and trailing punctuation go (``3.`` is 3), thousands separators go when
every group has three digits (``1,000``, ``1{,}000``, ``1\\,000``, ``1 000``), and a
trailing percent sign is set apart.  A percent sign counts only where the gold has
one: an answer with one against a gold without (``5\\%`` for 5, ``50\\%`` for 0.5) is
wrong, and a gold with one is compared by its number (``5`` or ``5\\%`` for ``5\\%``,
not ``0.05``).  A checker that accepts wrong answers is a reward-hacking surface, so
what stays ambiguous is rejected.  Two answers that are then the same string, or both
integer literals, are compared here without math-verify (``025`` equals ``25``, as
math-verify says).  Any exception inside math-verify scores False.  Never raises on a
completion.
"""

from __future__ import annotations

import atexit
import functools
import logging
import re
import threading

#: Longest boxed answer (characters) that is parsed at all.
MAX_ANSWER_CHARS = 100
#: Longest integer (digits) allowed in an exponent or before a factorial.
MAX_EXPONENT_DIGITS = 4
#: Seconds one math-verify comparison (parse + verify, in a worker process) may take.
CHECK_TIMEOUT_S = 5.0
#: Seconds a new checker process may take to start (imports math-verify, sympy).
WORKER_START_TIMEOUT_S = 120.0
#: Idle checker processes kept for reuse (more start while more threads check at once).
MAX_IDLE_WORKERS = 4

_BOXED = "\\boxed{"
_BIG_POWER = re.compile(r"(\^|\*\*)\s*\{?\s*[-+]?\d{%d,}" % (MAX_EXPONENT_DIGITS + 1))
_BIG_FACTORIAL = re.compile(r"\d{%d,}\s*!" % (MAX_EXPONENT_DIGITS + 1))
_NESTED_POWER = re.compile(r"(\^|\*\*)\s*\{[^{}]*(\^|\*\*)")
_INTEGER = re.compile(r"[-+]?\d+")
#: one separator kind between groups of exactly three digits: , {,} \, \; \: \! \  ~ or a space
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?P<sep>,|\{,\}|\\[,;:! ]|~| )\d{3}(?:(?P=sep)\d{3})*(?:\.\d+)?")
_SEPARATORS = re.compile(r",|\{,\}|\\[,;:! ]|~| ")
_TRAILING_PUNCTUATION = re.compile(r"(?<=\S)\s*[.,;:?]+$")    # not "!": a factorial
_PERCENT = re.compile(r"\s*\\?%$")
_BOX_OR_BRACE = re.compile(r"\\boxed\{|[{}]")

logging.getLogger("math_verify").setLevel(logging.ERROR)  # the "timeout is disabled" warnings


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (nested braces balanced),
    or None when there is none or it is not closed: ``"a \\boxed{1} \\boxed{\\frac{1}{2}}"``
    -> ``"\\frac{1}{2}"``.

    One pass over the braces (linear time: a megabyte of unclosed ``\\boxed{`` takes
    well under a second)."""
    if _BOXED not in text:
        return None
    stack: list[int] = []          # content start of an open box, or -1 for a plain brace
    best: tuple[int, int] | None = None
    for m in _BOX_OR_BRACE.finditer(text):
        if m.group() == "}":
            if stack:
                opened = stack.pop()
                if opened >= 0 and (best is None or opened > best[0]):
                    best = (opened, m.start())
        else:
            stack.append(m.end() if len(m.group()) > 1 else -1)
    return None if best is None else text[best[0]:best[1]]


def too_costly(answer: str) -> bool:
    """True for answers math-verify must not see: too long, nested exponents, or
    exponents/factorials with integers over :data:`MAX_EXPONENT_DIGITS` digits."""
    return (len(answer) > MAX_ANSWER_CHARS or bool(_BIG_POWER.search(answer))
            or bool(_BIG_FACTORIAL.search(answer)) or bool(_NESTED_POWER.search(answer))
            or answer.count("^") + answer.count("**") > 4)


def without_thousands(text: str) -> str:
    """``text`` without its thousands separators when it is one number written with them
    (groups of exactly three digits, one kind of separator): ``"1,000"``, ``"1{,}000"``,
    ``"1\\,000"``, ``"1 000 000"`` -> ``"1000"``, ``"1000000"``; anything else unchanged
    (``"1,2"``, ``"1 0000"``, ``"3 3"``: not a number with thousands separators)."""
    return _SEPARATORS.sub("", text) if _THOUSANDS.fullmatch(text) else text


def canonical_answer(text: str) -> tuple[str, bool]:
    """The form both sides of a comparison take, and whether it carried a percent sign.

    Surrounding whitespace and trailing punctuation (``.,;:?``; not ``!``, a factorial) are removed, then a
    trailing ``%`` or ``\\%`` (noted), then thousands separators
    (:func:`without_thousands`).  ``"5\\%."`` -> ``("5", True)``; ``"1 000"`` ->
    ``("1000", False)``; ``"3."`` -> ``("3", False)``.
    """
    text = _TRAILING_PUNCTUATION.sub("", text.strip())
    percent = bool(_PERCENT.search(text))
    if percent:
        text = _PERCENT.sub("", text)
    return without_thousands(text.strip()), percent


@functools.lru_cache(maxsize=8192)
def _parse(expr: str):
    from math_verify import parse

    return parse(_BOXED + expr + "}", parsing_timeout=None)


def _verify_here(gold: str, answer: str) -> bool:
    """math-verify in this process, unbounded in time: ``verify(parse(gold), parse(answer))``;
    False for unparseable input or any exception."""
    try:
        from math_verify import verify

        gold_p, answer_p = _parse(gold), _parse(answer)
        if not gold_p or not answer_p:
            return False
        return bool(verify(gold_p, answer_p, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - a malformed answer scores False, whatever math-verify raises
        return False


def serve_checks() -> None:
    """Body of a checker process (``python -c "from scalectl.rl.reward.checker import serve_checks;
    serve_checks()"``): reads ``[gold, answer]`` JSON lines on stdin, writes ``1`` or ``0``
    lines on stdout, until stdin closes.  Stray output of the libraries goes to stderr."""
    import json
    import os
    import sys

    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _verify_here("1", "1.0")  # load the LaTeX parser before reporting ready
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            gold, answer = json.loads(line)
            ok = _verify_here(str(gold), str(answer))
        except ValueError:
            ok = False
        out.write("1\n" if ok else "0\n")
        out.flush()


class _CheckTimeout(Exception):
    """A checker process did not answer in time (never cached)."""


class _Worker:
    """One checker process (a fresh interpreter running :func:`serve_checks`)."""

    def __init__(self):
        """Start the process and wait until it has loaded math-verify.

        Raises:
            RuntimeError: the process cannot be started, exits, or is not ready within
                :data:`WORKER_START_TIMEOUT_S` seconds.
        """
        import os
        import subprocess
        import sys

        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from scalectl.rl.reward.checker import serve_checks; serve_checks()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
        except OSError as exc:
            raise RuntimeError(f"cannot start a checker process: {exc}") from exc
        try:
            ready = self._read(WORKER_START_TIMEOUT_S) == "ready"
        except (_CheckTimeout, EOFError):
            ready = False
        if not ready:
            self.stop()
            raise RuntimeError(f"checker process did not start (or not within {WORKER_START_TIMEOUT_S} s)")

    def _read(self, timeout: float) -> str:
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise _CheckTimeout
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError("checker process exited")
        return line.strip()

    def ask(self, gold: str, answer: str, timeout: float) -> bool:
        import json

        self.proc.stdin.write(json.dumps([gold, answer]) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout) == "1"

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


class _WorkerPool:
    """Checker processes, one request at a time each; a worker that overruns its
    timeout is killed and a new one started on demand (~1 s: a fresh interpreter
    imports math-verify).  Thread-safe: each thread takes an idle worker or starts one."""

    def __init__(self):
        import os

        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.unavailable: str | None = None   # why workers cannot start (then: in-process)

    def run(self, gold: str, answer: str, timeout: float) -> bool:
        """math-verify on (gold, answer) in a worker; raises :class:`_CheckTimeout` after
        ``timeout`` seconds (the worker is killed)."""
        import os

        if self._pid != os.getpid():   # a forked child: the parent's workers are not ours
            self._idle, self._lock, self._pid = [], threading.Lock(), os.getpid()
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is not None and not worker.alive():
            worker.stop()          # died while idle
            worker = None
        if worker is None:
            worker = _Worker()
        try:
            result = worker.ask(gold, answer, timeout)
        except BaseException:
            worker.stop()          # overran, died or was interrupted
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


_POOL = _WorkerPool()
atexit.register(_POOL.close)


@functools.lru_cache(maxsize=65536)
def _verify_bounded(gold: str, answer: str, timeout: float) -> bool:
    if _POOL.unavailable is None:
        try:
            return _POOL.run(gold, answer, timeout)
        except (_CheckTimeout, EOFError, OSError):
            raise _CheckTimeout from None
        except Exception as exc:  # noqa: BLE001 - no process can be started here
            _POOL.unavailable = f"{type(exc).__name__}: {exc}"
            logging.getLogger(__name__).warning(
                "answer checking runs in-process, without a time bound: cannot start a checker process (%s)",
                _POOL.unavailable)
    return _verify_here(gold, answer)


def answers_match(answer: str, gold: str, *, timeout: float = CHECK_TIMEOUT_S) -> bool:
    """True when the boxed ``answer`` equals ``gold``.

    Both are normalised by :func:`canonical_answer`; an answer with a percent sign
    against a gold without one is False.  Then: the same string, the same integer when
    both are integer literals, else math-verify (``verify(parse(gold), parse(answer))``,
    in a checker process, at most ``timeout`` seconds).  False for too costly,
    unparseable or timed-out answers; never raises (but KeyboardInterrupt)."""
    (answer, answer_pct), (gold, gold_pct) = canonical_answer(answer), canonical_answer(gold)
    if answer_pct and not gold_pct:
        return False
    if answer == gold:
        return bool(answer)
    if not answer or too_costly(answer) or too_costly(gold):
        return False
    if _INTEGER.fullmatch(answer) and _INTEGER.fullmatch(gold):
        return int(answer) == int(gold)
    try:
        return _verify_bounded(gold, answer, float(timeout))
    except _CheckTimeout:
        return False


def check(completion_text: str, gold: str, *, timeout: float = CHECK_TIMEOUT_S) -> bool:
    """Is the completion's final answer (last ``\\boxed{}``) equal to ``gold``?

    Args:
        completion_text: the decoded completion.
        gold: the reference answer, without ``\\boxed{}`` (e.g. ``"363"``, ``"\\frac{1}{2}"``).
        timeout: seconds math-verify may take on this answer (see :func:`answers_match`).

    Returns:
        False when there is no closed ``\\boxed{}``; see :func:`answers_match` otherwise.
    """
    answer = last_boxed(completion_text)
    return answer is not None and answers_match(answer, gold, timeout=timeout)


def reward(completion_text: str, gold: str, *, timeout: float = CHECK_TIMEOUT_S) -> float:
    """+1.0 if :func:`check` passes, else -1.0 (rewards in {-1, +1}, docs/recipe-axes.md)."""
    return 1.0 if check(completion_text, gold, timeout=timeout) else -1.0
