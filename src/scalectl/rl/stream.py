"""The transport between generator and trainer processes, on torch.distributed.

A pipeline job has ``G`` generator tasks (global ranks ``0 .. G-1``) and one
trainer task (rank ``G``), as :mod:`scalectl.rl.roles` numbers them.  They
meet at a ``TCPStore`` on the job's rendezvous address (hosted by rank 0) and
build three point-to-point gloo process groups on it, one per flow:

* ``rollouts``: generator -> trainer, pickled finished groups;
* ``control``: trainer -> generator, pickled work requests and the stop word;
* ``weights``: trainer -> generator, the policy's weights as one flat byte
  tensor after a header ``[version, nbytes]`` (int64).

They are not torch.distributed's default group on purpose: the trainer's
DeepSpeed engine takes the default group as its data-parallel world, which
must hold trainers only.

A pickled object travels as its size (one int64) then its bytes (uint8).
Gloo completes a send only once the receiver has posted the matching receive,
and a gloo receive cannot be polled (``Work.is_completed`` turns true only in
``wait``), so every receiving end is a thread blocked in ``wait`` that hands
what arrives to the process's main thread (:class:`Inbox`,
:class:`WeightSlot`).  A peer that dies closes its connections: the blocked
receive raises at once and the inbox reports :class:`PeerLost`.  A process
must not exit while one of its receives is pending (gloo aborts it), so
every flow ends with a last message (:data:`BYE`, :data:`STOP`, a weights
header with version -1) that ends its receiving thread.
"""

from __future__ import annotations

import pickle
import queue
import threading
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from scalectl.rl.board import Board, PeerLost

FLOWS = ("rollouts", "control", "weights")
#: The last message on ``rollouts``: ``(BYE, reason)`` from a generator.
BYE = "bye"
#: The last message on ``control``: ``(STOP,)`` from the trainer.
STOP = "stop"


@dataclass
class Channel:
    """This task's three process groups (see the module docstring).

    Attributes:
        rank: this task's global rank; world: tasks in the job; trainer: the trainer's rank.
        board: this task's :class:`scalectl.rl.board.Board` (its card and heartbeat in the store).
    """

    rank: int
    world: int
    trainer: int
    groups: dict
    store: object
    board: object = None

    @classmethod
    def connect(cls, task, timeout_s: float = 600.0, idle_timeout_s: float = 7 * 24 * 3600.0, *,
                trainer: int | None = None) -> "Channel":
        """Join the job's rendezvous as ``task`` (a :class:`scalectl.rl.roles.Task`).

        Every task of the job joins (the groups span the job), but only the generators and the
        first trainer rank use them; the other trainer ranks follow the first one over the
        trainers' own group.

        Args:
            trainer: global rank of the first trainer (default: the last rank, one trainer).
            timeout_s: how long to wait for every task to join.
            idle_timeout_s: how long a receive may wait for data (generators and
                trainers idle for long stretches; a dead peer is noticed at once anyway).
        """
        store = dist.TCPStore(task.master_addr, task.master_port, task.world_size, task.rank == 0,
                              timeout=timedelta(seconds=timeout_s))
        board = Board(store, task)       # before the groups: once they are built, every task has its card
        groups = {name: dist.ProcessGroupGloo(dist.PrefixStore(f"scalectl/{name}", store), task.rank,
                                              task.world_size, timedelta(seconds=idle_timeout_s))
                  for name in FLOWS}
        return cls(task.rank, task.world_size, task.world_size - 1 if trainer is None else trainer, groups, store,
                   board)

    def close(self) -> None:
        """Drop the process groups (pending operations fail) and stop the heartbeat."""
        if self.board is not None:
            self.board.close()
        for pg in self.groups.values():
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass


def send_object(pg, obj, dst: int) -> list:
    """Send a picklable ``obj`` to rank ``dst``: its size, then its bytes.

    Returns:
        The two pending works (wait on them, or keep them alive until they complete).
    """
    payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
    size = torch.tensor([payload.numel()], dtype=torch.int64)
    return [pg.send([size], dst, 0), pg.send([payload], dst, 0)]


def recv_object(pg, src: int):
    """Receive one object sent by :func:`send_object` from rank ``src`` (blocking)."""
    size = torch.zeros(1, dtype=torch.int64)
    pg.recv([size], src, 0).wait()
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    pg.recv([payload], src, 0).wait()
    return pickle.loads(payload.numpy().tobytes())


class Inbox:
    """Objects from several senders on one flow, received by one thread per sender.

    ``get`` returns ``(src, obj)``; a sender whose connection fails yields
    ``(src, PeerLost(...))`` and its thread ends; a last message (a tuple
    starting with :data:`BYE` or :data:`STOP`) ends its thread after being delivered.
    """

    def __init__(self, pg, sources: list[int], name: str):
        self.queue: queue.Queue = queue.Queue()
        self.threads = [threading.Thread(target=self._run, args=(pg, src), name=f"{name}-from-{src}", daemon=True)
                        for src in sources]
        for t in self.threads:
            t.start()

    def _run(self, pg, src: int) -> None:
        while True:
            try:
                obj = recv_object(pg, src)
            except Exception as exc:  # noqa: BLE001 - a closed connection ends the flow
                self.queue.put((src, PeerLost(f"rank {src} stopped answering: {exc}")))
                return
            self.queue.put((src, obj))
            if isinstance(obj, tuple) and obj and obj[0] in (BYE, STOP):
                return

    def get(self, timeout: float | None = None):
        """The next ``(src, obj)``; raises ``queue.Empty`` after ``timeout`` seconds."""
        return self.queue.get(timeout=timeout)


# --------------------------------------------------------------------------- weights


def weight_layout(model) -> list[tuple[str, torch.Size, torch.dtype, int]]:
    """(name, shape, dtype, nbytes) of every tensor of ``model.state_dict()``, in order.
    Generator and trainer build the same model, so they agree on it."""
    return [(name, t.shape, t.dtype, t.numel() * t.element_size()) for name, t in model.state_dict().items()]


def flatten_weights(model) -> torch.Tensor:
    """The state dict as one uint8 tensor (the concatenated bytes of :func:`weight_layout`'s tensors)."""
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in model.state_dict().values()])


def unflatten_weights(flat: torch.Tensor, layout) -> dict:
    """Inverse of :func:`flatten_weights`: a state dict of views into ``flat``.

    Raises:
        ValueError: ``flat`` has the wrong number of bytes for ``layout``.
    """
    total = sum(n for *_, n in layout)
    if flat.numel() != total:
        raise ValueError(f"weights of {flat.numel()} bytes received, the model has {total}")
    out, at = {}, 0
    for name, shape, dtype, n in layout:
        out[name] = flat[at:at + n].view(dtype).view(shape)
        at += n
    return out


def send_weights(pg, flat: torch.Tensor, version: int, dst: int) -> list:
    """Send flat weights tagged ``version`` to rank ``dst``; returns the pending works."""
    header = torch.tensor([int(version), flat.numel()], dtype=torch.int64)
    return [pg.send([header], dst, 0), pg.send([flat], dst, 0)]


def end_weights(pg, dst: int) -> list:
    """The last message on the weights flow to rank ``dst`` (ends its :class:`WeightSlot` thread)."""
    return [pg.send([torch.tensor([-1, 0], dtype=torch.int64)], dst, 0)]


class WeightSlot:
    """The newest weights the trainer has sent, received by a thread; :meth:`poll`
    (the CPU engine's ``poll_weights`` hook) loads them into the engine between
    decoding steps.

    Args:
        pg: the ``weights`` process group; src: the trainer's rank.
        engine: the rollout engine (``update_weights(state_dict, version)``).
        layout: :func:`weight_layout` of the engine's model.
    """

    def __init__(self, pg, src: int, engine, layout):
        self.engine, self.layout = engine, layout
        self._latest: tuple[int, torch.Tensor] | None = None
        self._error: Exception | None = None
        self._lock = threading.Lock()
        self.arrived = threading.Event()
        self.loads = 0
        self.thread = threading.Thread(target=self._run, args=(pg, src), name="weights", daemon=True)
        self.thread.start()

    def _run(self, pg, src: int) -> None:
        nbytes = sum(n for *_, n in self.layout)
        while True:
            header = torch.zeros(2, dtype=torch.int64)
            try:
                pg.recv([header], src, 0).wait()
                if int(header[0]) < 0:                 # the trainer's last word
                    return
                flat = torch.empty(int(header[1]), dtype=torch.uint8)
                pg.recv([flat], src, 0).wait()
            except Exception as exc:  # noqa: BLE001
                with self._lock:
                    self._error = PeerLost(f"the trainer (rank {src}) stopped sending weights: {exc}")
                self.arrived.set()
                return
            if flat.numel() != nbytes:
                with self._lock:
                    self._error = ValueError(f"weights of {flat.numel()} bytes received, the model has {nbytes}")
                self.arrived.set()
                return
            with self._lock:
                self._latest = (int(header[0]), flat)
            self.arrived.set()

    def poll(self) -> bool:
        """Load the newest weights if any arrived since the last call; True if it loaded.

        Raises:
            PeerLost: the trainer's connection closed (only once no weights are pending).
        """
        with self._lock:
            latest, self._latest = self._latest, None
            error = self._error
            self.arrived.clear()
        if latest is None:
            if error is not None:
                raise error
            return False
        version, flat = latest
        self.engine.update_weights(unflatten_weights(flat, self.layout), version)
        self.loads += 1
        return True
