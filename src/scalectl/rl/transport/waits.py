"""Waits on torch.distributed works that look at the peer while they wait.

A gloo send completes only once the receiver has taken the bytes, and a receive once they came:
a peer that is stopped (``kill -STOP``), deadlocked or not reading its socket holds either for
ever, its connection open.  A wait on such a work must end on the job's no-progress limit
(``launcher.stall_timeout_s``), with the peer named by what its heartbeat says
(:class:`scalectl.rl.transport.board.Watch`).

Gloo's own timed wait on a point-to-point work cannot serve: when it expires, gloo closes every
connection of the process group ("Application timeout caused pair closure"), so the flow is lost
for every peer.  :func:`wait_works` therefore waits in a thread of its own and calls ``check``
(which raises once the peer is found lost or stuck) every ``slice_s`` seconds meanwhile.  A
collective's timed wait (a weights' broadcast) leaves the group intact: :func:`wait_collective`
waits on it in slices directly.

A wait given up leaves its work pending: the caller keeps the process group alive until the
process exits (:func:`scalectl.rl.transport.stream.keep_until_exit`).
"""

from __future__ import annotations

import threading
from datetime import timedelta

#: Seconds between two looks at the peers while a work is pending.
WAIT_SLICE_S = 1.0


def wait_works(works: list, check=None, slice_s: float = WAIT_SLICE_S) -> None:
    """Wait for every work of ``works`` (gloo sends or receives, in order), calling ``check()``
    every ``slice_s`` seconds until they complete.

    Args:
        works: torch.distributed ``Work`` handles.
        check: ``check()`` returns while the wait may go on and raises to end it (e.g. a
            :class:`~scalectl.rl.transport.board.TaskStuck`); None waits without bound.
        slice_s: seconds between two calls of ``check``.

    Raises:
        RuntimeError: from torch.distributed (the peer closed its connection); whatever ``check``
            raises (the works then stay pending).
    """
    if check is None:
        for w in works:
            w.wait()
        return
    done, failure = threading.Event(), []

    def run() -> None:
        try:
            for w in works:
                w.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="wait-works", daemon=True).start()
    while not done.wait(slice_s):
        check()
    if failure:
        raise failure[0]


def wait_collective(work, check=None, slice_s: float = WAIT_SLICE_S) -> None:
    """Wait for one gloo collective (a bucket of a broadcast), calling ``check()`` every
    ``slice_s`` seconds until it completes (a timed wait on a collective leaves its group intact).

    Raises:
        RuntimeError: from torch.distributed other than the slice's timeout; whatever ``check``
            raises.
    """
    if check is None:
        work.wait()
        return
    while True:
        try:
            work.wait(timedelta(seconds=slice_s))
            return
        except RuntimeError as exc:
            if "timed out" not in str(exc).lower():
                raise
        check()
