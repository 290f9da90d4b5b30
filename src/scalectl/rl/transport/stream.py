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
  one-element header holding the version (and whether that version is to be
  evaluated, :func:`header_value`); the group holds the generators and the leader
  (the leader last), gloo on CPUs and NCCL on GPUs.  A generator whose engine
  runs in workers of its own (vLLM, tensor-parallel or not) takes one seat per
  worker, and its workers join the group themselves (:class:`Seats`,
  :mod:`scalectl.rl.transport.vllm_worker`);
* ``eval_weights``: with a dedicated evaluation generator
  (``hardware.evaluation = dedicated``), the leader -> that generator alone, the
  weights of the versions to evaluate; it is then not in ``weights``.

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
at once and the inbox reports :class:`PeerLost`.  A peer that lives but takes nothing (stopped,
deadlocked) holds a send or a broadcast for ever: every such wait of the trainer and the
generators looks at the peer's heartbeat meanwhile and ends on the job's no-progress limit
(:mod:`scalectl.rl.transport.waits`, :class:`scalectl.rl.transport.board.Watch`).  A process must not exit
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

from scalectl.rl.transport.board import JOB_ENDING, Board, PeerLost
from scalectl.rl.transport.broadcast import StatelessGroup, WeightReceiver, broadcast_weights
from scalectl.rl.transport.roles import rendezvous_store
from scalectl.rl.transport.slot import BaseWeightSlot, Check
from scalectl.rl.transport.waits import wait_works
from scalectl.rl.transport.weight_sync import BUCKET_BYTES

FLOWS = ("rollouts", "control")
#: The weights' groups: the training generators' and the dedicated evaluation generator's.
WEIGHT_GROUPS = ("weights", "eval_weights")
#: The bit of the weights' header that asks the generators to evaluate the version it carries.
EVALUATE_BIT = 1 << 62
#: The last message on ``rollouts``: ``(BYE, reason)`` from a generator.
BYE = "bye"
#: The last message on ``control``: ``(STOP,)`` from the trainer.
STOP = "stop"


@dataclass(frozen=True)
class Seats:
    """A task's place in one weights' group.

    Attributes:
        name: the group (:data:`WEIGHT_GROUPS`); its rendezvous is the job's store under
            ``scalectl/NAME``.
        first: this task's first group rank; count: its seats (a generator's engine workers,
            each receiving the weights itself, or 1).
        size: the group's size; the leader trainer is its last rank (``size - 1``).
    """

    name: str
    first: int
    count: int
    size: int

    @property
    def prefix(self) -> str:
        """The group's prefix in the job's rendezvous store."""
        return f"scalectl/{self.name}"

    @property
    def leader(self) -> int:
        """The sending rank (the leader trainer)."""
        return self.size - 1


def weight_seats(rank: int, trainer: int, *, seats_per_generator: int = 1,
                 evaluator: int | None = None) -> dict[str, Seats]:
    """Where task ``rank`` sits in the weights' groups (see the module docstring).

    Args:
        rank: the task's global rank; generators are ranks ``0 .. trainer - 1``.
        trainer: the leader trainer's rank (in every group, last).
        seats_per_generator: the workers of a generator's engine (its tensor-parallel size for
            vLLM, whose workers receive the weights; 1 for an engine in the process itself).
        evaluator: the dedicated evaluation generator's rank (in ``eval_weights`` alone), or None.

    Returns:
        Group name -> :class:`Seats`; empty for a follower trainer rank (it pushes nothing).
    """
    t = seats_per_generator
    training = [g for g in range(trainer) if g != evaluator]
    plans = {"weights": {g: i * t for i, g in enumerate(training)} | {trainer: len(training) * t}}
    if evaluator is not None:
        plans["eval_weights"] = {evaluator: 0, trainer: t}
    return {name: Seats(name, seat[rank], 1 if rank == trainer else t, seat[trainer] + 1)
            for name, seat in plans.items() if rank in seat}


@dataclass
class Channel:
    """This task's process groups (see the module docstring): ``groups`` by flow name; only the
    generators and the leader trainer have weights' groups (each a
    :class:`~scalectl.rl.transport.broadcast.StatelessGroup`, or, for a generator whose engine
    workers receive the weights, its :class:`Seats` in ``seats`` for them to join).

    Attributes:
        rank: this task's global rank; world: tasks in the job; trainer: the trainer's rank.
        board: this task's :class:`scalectl.rl.transport.board.Board` (its card and heartbeat in the store).
        seats: weights' group name -> this task's :class:`Seats`.
        address: the job's rendezvous store (host, port), for workers that join a weights' group.
    """

    rank: int
    world: int
    trainer: int
    groups: dict
    store: object
    board: object = None
    seats: dict = None
    address: tuple = None

    @classmethod
    def connect(cls, task, timeout_s: float = 600.0, idle_timeout_s: float = 7 * 24 * 3600.0, *,
                trainer: int | None = None, device: str = "cpu", seats_per_generator: int = 1,
                workers_join: bool = False, evaluator: int | None = None) -> "Channel":
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
            seats_per_generator, evaluator: the weights' groups (:func:`weight_seats`).
            workers_join: this generator's engine workers join its weights' group (they hold
                its seats); the task itself does not.
        """
        store = rendezvous_store(task, timeout_s)
        board = Board(store, task)       # before the groups: once they are built, every task has its card
        groups = {name: dist.ProcessGroupGloo(dist.PrefixStore(f"scalectl/{name}", store), task.rank,
                                              task.world_size, timedelta(seconds=idle_timeout_s))
                  for name in FLOWS}
        trainer = task.world_size - 1 if trainer is None else trainer
        seats = weight_seats(task.rank, trainer, seats_per_generator=seats_per_generator, evaluator=evaluator)
        for name, seat in seats.items():
            if not (workers_join and task.rank != trainer):
                groups[name] = StatelessGroup("", 0, seat.first, seat.size, device, idle_timeout_s,
                                              store=dist.PrefixStore(seat.prefix, store))
        return cls(task.rank, task.world_size, trainer, groups, store, board, seats,
                   (task.master_addr, task.master_port))

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


def send_waiting(pg, obj, dst: int, check=None) -> None:
    """Send ``obj`` to rank ``dst`` (:func:`send_object`) and wait until it is taken, calling
    ``check()`` every second meanwhile (:func:`scalectl.rl.transport.waits.wait_works`).

    Raises:
        RuntimeError: from torch.distributed (``dst`` closed its connection); whatever ``check``
            raises (``dst`` lost or stuck: the send stays pending, keep the channel with
            :func:`keep_until_exit`).
    """
    wait_works(send_object(pg, obj, dst), check)


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
    With a ``tap``, every ``(src, obj)`` (a :class:`PeerLost` too) is first shown to
    ``tap(src, obj)`` as it arrives, in the receiving thread: True takes it out of the queue
    (e.g. evaluation results, read by someone else), False lets it through.
    """

    def __init__(self, pg, sources: list[int], name: str, tap=None):
        self.queue: queue.Queue = queue.Queue()
        self.tap = tap
        self.threads = [threading.Thread(target=self._run, args=(pg, src), name=f"{name}-from-{src}", daemon=True)
                        for src in sources]
        for t in self.threads:
            t.start()

    def _put(self, src: int, obj) -> None:
        if self.tap is None or not self.tap(src, obj):
            self.queue.put((src, obj))

    def _run(self, pg, src: int) -> None:
        while True:
            try:
                obj = recv_object(pg, src)
            except Exception as exc:  # noqa: BLE001 - a closed connection ends the flow
                self._put(src, PeerLost(f"rank {src} stopped answering: {exc}"))
                return
            self._put(src, obj)
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


def header_value(version: int, evaluate: bool = False) -> int:
    """The weights' header: the version, with :data:`EVALUATE_BIT` set when the generators are to
    evaluate it (-1, the last word, is never evaluated).

    Raises:
        ValueError: a version outside -1 .. 2**62 - 1.
    """
    if not -1 <= version < EVALUATE_BIT:
        raise ValueError(f"weights version {version} outside -1 .. 2**62 - 1")
    return int(version) | (EVALUATE_BIT if evaluate and version >= 0 else 0)


def read_header(value: int) -> tuple[int, bool]:
    """(version, evaluate) of a weights' header (:func:`header_value`)."""
    value = int(value)
    if value < 0:
        return value, False
    return value & (EVALUATE_BIT - 1), bool(value & EVALUATE_BIT)


def _header(version: int, device, evaluate: bool = False) -> torch.Tensor:
    return torch.tensor([header_value(version, evaluate)], dtype=torch.int64, device=device)


def push_weights(group, model, version: int, bucket_bytes: int = BUCKET_BYTES, wait=None, *, evaluate: bool = False):
    """Broadcast ``model``'s state dict, tagged ``version``, from the trainer to every generator.

    The tensors travel as :func:`scalectl.rl.transport.broadcast.broadcast_weights` sends them
    (buckets of one dtype, at most ``bucket_bytes``), after a one-element int64 header
    holding the version (a bucket of its own; :func:`header_value`).  Under ZeRO-3 call it while
    the parameters are gathered (:meth:`scalectl.rl.train.trainer.PolicyTrainer.gathered`).  Blocks
    until every generator has taken the previous version (:class:`WeightSlot` keeps one posted).

    Args:
        group: the channel's weights group (``Channel.groups["weights"]``); the trainer is
            its last rank.
        wait: ``wait(work)`` waits for each bucket's broadcast (default ``work.wait()``, without
            bound); the trainer's feeder looks at its generators meanwhile.
        evaluate: ask the generators to evaluate this version: each holds it, loading no later
            version, until it has sampled its share of the held-out prompts
            (:attr:`WeightSlot.hold`).

    Returns:
        The :class:`~scalectl.rl.transport.broadcast.BroadcastStats` of the push (header included).

    Raises:
        RuntimeError: from torch.distributed (a generator gone).
    """
    tensors = [t.detach() for t in model.state_dict().values()]
    device = tensors[0].device if tensors else "cpu"
    return broadcast_weights([_header(version, device, evaluate), *tensors], group.rank, group, bucket_bytes,
                             wait=wait)


def end_weights(group, layout, device="cpu", bucket_bytes: int = BUCKET_BYTES, wait=None) -> None:
    """The last message on the weights flow: version -1 on tensors of ``layout`` (their
    contents unused), which ends every generator's :class:`WeightSlot`; ``wait`` as for
    :func:`push_weights`."""
    tensors = [torch.empty(shape, dtype=dtype, device=device) for _, shape, dtype, _ in layout]
    broadcast_weights([_header(-1, device), *tensors], group.rank, group, bucket_bytes, wait=wait)


class WeightSlot(BaseWeightSlot):
    """A CPU engine's end of the weights flow (a :class:`~scalectl.rl.transport.slot.BaseWeightSlot`):
    the next version is kept posted (a :class:`~scalectl.rl.transport.broadcast.WeightReceiver`);
    :meth:`poll` (the CPU engine's
    ``poll_weights`` hook) loads it into the engine between decoding steps once it has
    arrived whole.

    A version pushed to be evaluated (:func:`push_weights` with ``evaluate``) is loaded as any
    other and then *held*: :attr:`hold` is its version and :meth:`poll` loads nothing more
    (a later version may arrive meanwhile; it waits in the receive buffers, and the trainer's
    push after it waits for this generator) until :meth:`release`, so every completion the
    generator samples for the evaluation has that version's weights.

    Args:
        group: the weights group; src: the trainer's rank in it.
        engine: the rollout engine (``update_weights(state_dict, version)``).
        layout: :func:`weight_layout` of the engine's model.
        device: where the received tensors live (``cuda`` with NCCL).

    Attributes:
        loads: versions loaded; ended: the trainer's last word (version -1) came;
        hold: the version held for an evaluation, or None;
        stats: the last load's :class:`~scalectl.rl.transport.broadcast.BroadcastStats`.
    """

    def __init__(self, group, src: int, engine, layout, device="cpu", bucket_bytes: int = BUCKET_BYTES):
        self.engine, self.src = engine, src
        self.names = [name for name, *_ in layout]
        self.header = _header(0, device)
        self.tensors = [torch.empty(shape, dtype=dtype, device=device) for _, shape, dtype, _ in layout]
        self.loads, self.ended, self.hold = 0, False, None
        self.receiver = WeightReceiver([self.header, *self.tensors], src, group, bucket_bytes,
                                       on_update=self._loaded)

    def _loaded(self, _count: int) -> bool:
        version, evaluate = read_header(self.header[0])
        if version < 0:
            self.ended = True
            return False
        self.engine.update_weights(dict(zip(self.names, self.tensors)), version)
        self.loads += 1
        if evaluate:
            self.hold = version
        return True

    @property
    def stats(self):
        """The last load's :class:`~scalectl.rl.transport.broadcast.BroadcastStats`."""
        return self.receiver.stats

    def poll(self, wait: bool = False, check: Check | None = None) -> bool:
        """Load the newest weights if a whole version arrived (with ``wait``, once one has,
        calling ``check()`` every second meanwhile: it raises to give up); True if it loaded one.
        False at once after the trainer's last word, or while a version is held (:attr:`hold`).

        Raises:
            PeerLost: the trainer's connection closed; whatever ``check`` raises.
        """
        if self.hold is not None:
            return False
        try:
            return self.receiver.poll(wait, check) and not self.ended
        except JOB_ENDING:                 # check()'s verdict on the trainer, not a closed connection
            raise
        except RuntimeError as exc:
            self.receiver.close()
            raise PeerLost(f"the trainer (rank {self.src}) stopped sending weights: {exc}") from exc

    def awaiting(self) -> bool:
        """A version's broadcast is still posted (none is once the trainer's connection closed)."""
        return bool(self.receiver.works)
