"""The transport between generator and trainer processes, on torch.distributed.

A pipeline job has ``G`` generator tasks (global ranks ``0 .. G-1``) and
trainer tasks (ranks ``G ..``, the first of them the leader), as
:mod:`scalectl.rl.transport.roles` numbers them.  They meet at a ``TCPStore`` on the
job's rendezvous address (hosted by rank 0) and build three process groups on
it, one per flow:

* ``rollouts``: generator -> trainer, pickled finished groups (point to point, gloo);
* ``control``: trainer -> generator, pickled work requests and the stop word (point to point, gloo);
* ``weights``: the leader trainer -> every generator at once, the policy's
  weights as a bucketed broadcast (:mod:`scalectl.rl.transport.broadcast`) after a
  one-element header holding the version; the group holds the generators and
  the leader (ranks ``0 .. G``, the leader last), gloo on CPUs and NCCL on GPUs.

They are not torch.distributed's default group on purpose: the trainer's
DeepSpeed engine takes the default group as its data-parallel world, which
must hold trainers only.

A pickled object travels as its size (one int64) then its bytes (uint8).
Gloo completes a send only once the receiver has posted the matching receive,
and a gloo receive cannot be polled (``Work.is_completed`` turns true only in
``wait``), so every receiving end of a point-to-point flow is a thread blocked
in ``wait`` that hands what arrives to the process's main thread
(:class:`Inbox`).  A generator keeps the broadcast of the next weights posted
and loads them between two decoding steps (:class:`WeightSlot`), so the
leader's push waits only for every generator to have taken the previous
version.  A peer that dies closes its connections: the blocked receive raises
at once and the inbox reports :class:`PeerLost`.  A process must not exit
while one of its receives is pending (gloo aborts it), so every flow ends
with a last message (:data:`BYE`, :data:`STOP`, weights of version -1) that
ends its receiving end.
"""

from __future__ import annotations

import pickle
import queue
import threading
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from scalectl.rl.transport.board import Board, PeerLost
from scalectl.rl.transport.broadcast import StatelessGroup, WeightReceiver, broadcast_weights
from scalectl.rl.transport.roles import rendezvous_store
from scalectl.rl.transport.weight_sync import BUCKET_BYTES

FLOWS = ("rollouts", "control")
#: The last message on ``rollouts``: ``(BYE, reason)`` from a generator.
BYE = "bye"
#: The last message on ``control``: ``(STOP,)`` from the trainer.
STOP = "stop"


@dataclass
class Channel:
    """This task's process groups (see the module docstring): ``groups`` by flow name; only the
    generators and the leader trainer have ``weights`` (a :class:`~scalectl.rl.transport.broadcast.StatelessGroup`).

    Attributes:
        rank: this task's global rank; world: tasks in the job; trainer: the trainer's rank.
        board: this task's :class:`scalectl.rl.transport.board.Board` (its card and heartbeat in the store).
    """

    rank: int
    world: int
    trainer: int
    groups: dict
    store: object
    board: object = None

    @classmethod
    def connect(cls, task, timeout_s: float = 600.0, idle_timeout_s: float = 7 * 24 * 3600.0, *,
                trainer: int | None = None, device: str = "cpu") -> "Channel":
        """Join the job's rendezvous as ``task`` (a :class:`scalectl.rl.transport.roles.Task`).

        Every task of the job joins (the groups span the job), but only the generators and the
        first trainer rank use them; the other trainer ranks follow the first one over the
        trainers' own group.

        Args:
            trainer: global rank of the first trainer (default: the last rank, one trainer).
            timeout_s: how long to wait for every task to join.
            idle_timeout_s: how long a receive may wait for data (generators and
                trainers idle for long stretches; a dead peer is noticed at once anyway).
            device: ``cuda``: the weights' broadcast runs on NCCL when a GPU is present.
        """
        store = rendezvous_store(task, timeout_s)
        board = Board(store, task)       # before the groups: once they are built, every task has its card
        groups = {name: dist.ProcessGroupGloo(dist.PrefixStore(f"scalectl/{name}", store), task.rank,
                                              task.world_size, timedelta(seconds=idle_timeout_s))
                  for name in FLOWS}
        trainer = task.world_size - 1 if trainer is None else trainer
        if task.rank <= trainer:
            groups["weights"] = StatelessGroup("", 0, task.rank, trainer + 1, device, idle_timeout_s,
                                               store=dist.PrefixStore("scalectl/weights", store))
        return cls(task.rank, task.world_size, trainer, groups, store, board)

    def close(self) -> None:
        """Drop the process groups (pending operations fail) and stop the heartbeat."""
        if self.board is not None:
            self.board.close()
        for pg in self.groups.values():
            try:
                getattr(pg, "pg", pg).shutdown()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass


#: Channels given up with an operation still pending (a weights push to a generator that stopped
#: taking weights), kept until the process exits: destroying a gloo process group joins its worker
#: thread, which waits for ever on a broadcast whose peer is alive but stuck.
_KEPT: list = []


def keep_until_exit(channel: Channel) -> None:
    """Keep ``channel`` (its process groups) alive until the process exits (see :data:`_KEPT`)."""
    _KEPT.append(channel)


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
    Generator and trainer build the same model, so they agree on it (under ZeRO-3, only
    while the trainer's parameters are gathered)."""
    return [(name, t.shape, t.dtype, t.numel() * t.element_size()) for name, t in model.state_dict().items()]


def _header(version: int, device) -> torch.Tensor:
    return torch.tensor([int(version)], dtype=torch.int64, device=device)


def push_weights(group, model, version: int, bucket_bytes: int = BUCKET_BYTES, wait=None):
    """Broadcast ``model``'s state dict, tagged ``version``, from the trainer to every generator.

    The tensors travel as :func:`scalectl.rl.transport.broadcast.broadcast_weights` sends them
    (buckets of one dtype, at most ``bucket_bytes``), after a one-element int64 header
    holding the version (a bucket of its own).  Under ZeRO-3 call it while the parameters
    are gathered (:meth:`scalectl.rl.train.trainer.PolicyTrainer.gathered`).  Blocks until every
    generator has taken the previous version (:class:`WeightSlot` keeps one posted).

    Args:
        group: the channel's weights group (``Channel.groups["weights"]``); the trainer is
            its last rank.
        wait: ``wait(work)`` waits for each bucket's broadcast (default ``work.wait()``, without
            bound); the trainer's feeder looks at its generators meanwhile.

    Returns:
        The :class:`~scalectl.rl.transport.broadcast.BroadcastStats` of the push (header included).

    Raises:
        RuntimeError: from torch.distributed (a generator gone).
    """
    tensors = [t.detach() for t in model.state_dict().values()]
    device = tensors[0].device if tensors else "cpu"
    return broadcast_weights([_header(version, device), *tensors], group.rank, group, bucket_bytes, wait=wait)


def end_weights(group, layout, device="cpu", bucket_bytes: int = BUCKET_BYTES) -> None:
    """The last message on the weights flow: version -1 on tensors of ``layout`` (their
    contents unused), which ends every generator's :class:`WeightSlot`."""
    tensors = [torch.empty(shape, dtype=dtype, device=device) for _, shape, dtype, _ in layout]
    broadcast_weights([_header(-1, device), *tensors], group.rank, group, bucket_bytes)


class WeightSlot:
    """A generator's end of the weights flow: the next version is kept posted (a
    :class:`~scalectl.rl.transport.broadcast.WeightReceiver`); :meth:`poll` (the CPU engine's
    ``poll_weights`` hook) loads it into the engine between decoding steps once it has
    arrived whole.

    Args:
        group: the weights group; src: the trainer's rank in it.
        engine: the rollout engine (``update_weights(state_dict, version)``).
        layout: :func:`weight_layout` of the engine's model.
        device: where the received tensors live (``cuda`` with NCCL).

    Attributes:
        loads: versions loaded; ended: the trainer's last word (version -1) came;
        stats: the last load's :class:`~scalectl.rl.transport.broadcast.BroadcastStats`.
    """

    def __init__(self, group, src: int, engine, layout, device="cpu", bucket_bytes: int = BUCKET_BYTES):
        self.engine, self.src = engine, src
        self.names = [name for name, *_ in layout]
        self.header = _header(0, device)
        self.tensors = [torch.empty(shape, dtype=dtype, device=device) for _, shape, dtype, _ in layout]
        self.loads, self.ended = 0, False
        self.receiver = WeightReceiver([self.header, *self.tensors], src, group, bucket_bytes,
                                       on_update=self._loaded)

    def _loaded(self, _count: int) -> bool:
        version = int(self.header[0])
        if version < 0:
            self.ended = True
            return False
        self.engine.update_weights(dict(zip(self.names, self.tensors)), version)
        self.loads += 1
        return True

    @property
    def stats(self):
        return self.receiver.stats

    def poll(self, wait: bool = False) -> bool:
        """Load the newest weights if a whole version arrived (with ``wait``, once one has);
        True if it loaded one.  False at once after the trainer's last word.

        Raises:
            PeerLost: the trainer's connection closed.
        """
        try:
            return self.receiver.poll(wait) and not self.ended
        except RuntimeError as exc:
            self.receiver.close()
            raise PeerLost(f"the trainer (rank {self.src}) stopped sending weights: {exc}") from exc

    def drain(self) -> None:
        """Load versions until the trainer's last word (after its stop, before exiting, so
        that no broadcast is left pending); returns at once if the trainer is gone."""
        try:
            while not self.ended and self.receiver.works:
                self.poll(wait=True)
        except PeerLost:
            pass
