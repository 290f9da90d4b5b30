"""Weights from the first trainer to every generator: a bucketed broadcast over a process group.

After each optimiser step the first trainer holds the full weights (under
ZeRO-3 the gathered parameters) and broadcasts them over a process group made
for weights, holding that trainer and the generators: NCCL on GPUs, gloo on
CPUs (:func:`weight_group`).  Tensors are packed in model order into flat
buckets of at most ``bucket_bytes`` of one dtype (:func:`scalectl.rl.transport.weight_sync.bucket_ranges`),
one ``broadcast`` per bucket; each receiver unpacks a bucket into its own
tensors in place (a generator calls it between two decoding steps, so the
engine keeps its buffers).

Every rank of the group calls :func:`broadcast_weights` with tensors of the
same shapes and dtypes in the same order; the source's are sent, the others'
are overwritten.  The sizes of the buckets follow from the tensors alone, so
no metadata travels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from scalectl.rl.transport.weight_sync import BUCKET_BYTES, bucket_ranges


@dataclass(frozen=True)
class BroadcastStats:
    """What one broadcast moved and how long it took on this rank.

    Attributes:
        bytes: bytes of all the tensors (what every receiver gets).
        buckets: collectives issued.
        seconds: wall-clock time of the broadcast on this rank, packing and
            unpacking included (CUDA synchronised).
    """

    bytes: int
    buckets: int
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        """Bytes per second to each receiver."""
        return self.bytes / self.seconds if self.seconds > 0 else float("inf")


def weight_group(ranks: list[int], device: str = "cpu"):
    """A process group for the weights over global ``ranks`` (first trainer and generators):
    NCCL when ``device == "cuda"`` and a GPU is present, gloo otherwise. Every rank of the
    default group must call it (torch.distributed's rule for ``new_group``)."""
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" and torch.cuda.is_available() else "gloo"
    return dist.new_group(ranks=sorted(ranks), backend=backend)


class StatelessGroup:
    """A process group for the weights outside torch.distributed's default world.

    A generator whose engine owns the process's torch.distributed world (vLLM's
    workers do), or a trainer whose default world is DeepSpeed's, joins the
    weights' group through this instead: its own rendezvous (a ``TCPStore`` at
    ``host:port``, served by rank 0), its own gloo or NCCL group, nothing
    registered globally (the pattern vLLM documents for RLHF weight sync, with
    torch's process-group classes).

    Args:
        host, port: the rendezvous; rank 0 (the trainer) listens there.
        rank: this process's rank in the weights' group (the trainer is 0).
        size: the group's size (1 + generators).
        device: ``cuda`` for NCCL when a GPU is present, else gloo.
        timeout_s: how long a collective may wait.
        store: a store to meet on instead of a new ``TCPStore`` at ``host:port`` (e.g. a
            ``PrefixStore`` over a job's rendezvous store); ``host`` and ``port`` are then unused.
    """

    def __init__(self, host: str, port: int, rank: int, size: int, device: str = "cpu",
                 timeout_s: float = 300.0, store=None):
        import torch.distributed as dist
        from datetime import timedelta

        timeout = timedelta(seconds=timeout_s)
        self.store = store if store is not None else dist.TCPStore(host, port, size, rank == 0, timeout=timeout)
        self.rank, self.size = rank, size
        if device == "cuda" and torch.cuda.is_available():
            self.backend = "nccl"
            self.pg = dist.ProcessGroupNCCL(self.store, rank, size)
        else:
            self.backend = "gloo"
            self.pg = dist.ProcessGroupGloo(self.store, rank, size, timeout)

    def broadcast(self, tensor: torch.Tensor, src: int):
        """Asynchronous broadcast of ``tensor`` from group rank ``src``; returns the work handle."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = src
        return self.pg.broadcast([tensor], opts)


def _my_rank(group) -> int:
    import torch.distributed as dist

    return group.rank if isinstance(group, StatelessGroup) else dist.get_rank()


def _broadcast(tensor: torch.Tensor, src: int, group, async_op: bool, wait=None):
    import torch.distributed as dist

    if isinstance(group, StatelessGroup):
        work = group.broadcast(tensor, src)
    else:
        work = dist.broadcast(tensor, src=src, group=group, async_op=async_op or wait is not None)
    if not async_op and work is not None:
        (wait or (lambda w: w.wait()))(work)
    return work


def buckets_of(tensors: list[torch.Tensor], bucket_bytes: int = BUCKET_BYTES) -> list[tuple[int, int]]:
    """Half-open index ranges of ``tensors`` making the buckets: consecutive tensors of one
    dtype (and device), at most ``bucket_bytes`` together unless a tensor is larger alone."""
    ranges: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(tensors) + 1):
        if i == len(tensors) or (tensors[i].dtype, tensors[i].device) != (tensors[start].dtype, tensors[start].device):
            sizes = [t.numel() * t.element_size() for t in tensors[start:i]]
            ranges += [(start + a, start + b) for a, b in bucket_ranges(sizes, bucket_bytes)]
            start = i
    return ranges


@torch.no_grad()
def broadcast_weights(tensors: list[torch.Tensor], src: int, group=None,
                      bucket_bytes: int = BUCKET_BYTES, wait=None) -> BroadcastStats:
    """Broadcast ``tensors`` from global rank ``src`` to every rank of ``group``, in buckets.

    Args:
        tensors: the model's tensors in one fixed order (e.g. ``list(model.parameters())``
            or the values of a state dict); contiguous or not. On receivers they are
            overwritten in place.
        src: the sending rank (global rank, as torch.distributed counts; the group rank
            for a :class:`StatelessGroup`).
        group: the weights' process group (:func:`weight_group` or :class:`StatelessGroup`);
            None is the default group.
        bucket_bytes: the most bytes per collective.
        wait: ``wait(work)`` waits for each bucket's collective (default: ``work.wait()``); e.g.
            a wait in slices that looks at the receivers in between.

    Returns:
        :class:`BroadcastStats` of this rank.

    Raises:
        RuntimeError: from torch.distributed (a peer gone, a timeout).
    """
    started = time.perf_counter()
    me = _my_rank(group)
    ranges = buckets_of(tensors, bucket_bytes)
    total = 0
    for a, b in ranges:
        part = tensors[a:b]
        if me == src:
            flat = torch.cat([t.reshape(-1) for t in part]) if b - a > 1 else part[0].reshape(-1).contiguous()
        else:
            flat = torch.empty(sum(t.numel() for t in part), dtype=part[0].dtype, device=part[0].device)
        _broadcast(flat, src, group, async_op=False, wait=wait)
        if me != src:
            offset = 0
            for t in part:
                t.copy_(flat[offset:offset + t.numel()].view(t.shape))
                offset += t.numel()
        total += flat.numel() * flat.element_size()
    if tensors and tensors[0].is_cuda:
        torch.cuda.synchronize()
    return BroadcastStats(total, len(ranges), time.perf_counter() - started)


class WeightReceiver:
    """A generator's side of the weight broadcast, for in-flight updates between decoding steps.

    The receiver keeps the broadcast of the next version posted (asynchronous
    ``broadcast`` into flat bucket buffers); :meth:`poll`, called before every
    forward pass (e.g. as :attr:`scalectl.rl.rollout.cpu.CPURolloutEngine.poll_weights`),
    returns at once unless every bucket of a new version has arrived, in which
    case it copies them into the model's tensors in place and posts the next.
    The trainer's :func:`broadcast_weights` therefore never waits for a
    generator to finish a batch, only for it to have taken the previous version
    (one update in flight).

    Args:
        tensors: the generator's tensors, in the trainer's order (same shapes and dtypes).
        src: the trainer's rank (global; the group rank for a :class:`StatelessGroup`).
        group: the weights' process group (or a :class:`StatelessGroup`).
        bucket_bytes: as the trainer's.
        on_update: called as ``on_update(version)`` after a version is loaded (e.g. to
            tag later tokens with it); versions count from 1.  When it returns False the
            receiver posts no further broadcast (that version was the sender's last).

    Attributes:
        version: updates loaded so far.
        stats: :class:`BroadcastStats` of the last update (bytes, buckets, seconds from the
            first poll that found it complete to the end of unpacking).
    """

    def __init__(self, tensors: list[torch.Tensor], src: int, group=None, bucket_bytes: int = BUCKET_BYTES,
                 on_update=None):
        self.tensors, self.src, self.group = tensors, src, group
        self.ranges = buckets_of(tensors, bucket_bytes)
        self.buffers = [torch.empty(sum(t.numel() for t in tensors[a:b]), dtype=tensors[a].dtype,
                                    device=tensors[a].device) for a, b in self.ranges]
        self.on_update = on_update
        self.version = 0
        self.stats: BroadcastStats | None = None
        self.works: list = []
        self._post()

    def _post(self) -> None:
        self.works = [_broadcast(buf, self.src, self.group, async_op=True) for buf in self.buffers]

    def ready(self) -> bool:
        """Whether every bucket of the next version has arrived."""
        return all(w.is_completed() for w in self.works)

    @torch.no_grad()
    def poll(self, wait: bool = False, check=None) -> bool:
        """Load the next version if it has arrived (or, with ``wait``, once it has; ``check()`` is
        called every second meanwhile and raises to give up:
        :func:`scalectl.rl.transport.waits.wait_collective`).

        Returns:
            True when a version was loaded; False at once after the last one (``on_update``
            returned False) or after :meth:`close`.

        Raises:
            RuntimeError: from torch.distributed (the trainer is gone); whatever ``check`` raises.
        """
        from scalectl.rl.transport.waits import wait_collective

        if not self.works or (not wait and not self.ready()):
            return False
        started = time.perf_counter()
        for work in self.works:
            wait_collective(work, check if wait else None)
        total = 0
        for (a, b), buf in zip(self.ranges, self.buffers):
            offset = 0
            for t in self.tensors[a:b]:
                t.copy_(buf[offset:offset + t.numel()].view(t.shape))
                offset += t.numel()
            total += buf.numel() * buf.element_size()
        self.version += 1
        self.stats = BroadcastStats(total, len(self.ranges), time.perf_counter() - started)
        if self.on_update is not None and self.on_update(self.version) is False:
            self.works = []
            return True
        self._post()
        return True

    def close(self) -> None:
        """Stop receiving: the posted broadcast stays pending until the group is destroyed."""
        self.works = []
