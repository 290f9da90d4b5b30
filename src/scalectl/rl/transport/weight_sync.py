"""The weight-sync plan: how a policy's weights travel from the trainers to the generators.

After every optimiser step the first trainer broadcasts the full weights to
every generator over a process group made for weights (NCCL on GPUs, gloo on
CPUs; :mod:`scalectl.rl.transport.broadcast`).  Parameters are packed, in model order,
into flat buckets of at most ``bucket_bytes``, one collective per bucket, so
that 8B weights (16 GB in bf16) go out in a few dozen large messages rather
than hundreds of small ones, and the memory a bucket needs on each side stays
bounded.  A parameter larger than a bucket travels alone.

Pure functions, no torch: the dry run uses them without a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalectl.display import bytes_text

#: Default bucket size: 256 MiB.
BUCKET_BYTES = 256 * 2**20

#: Bytes per element of each model dtype.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def bucket_ranges(sizes: list[int], bucket_bytes: int = BUCKET_BYTES) -> list[tuple[int, int]]:
    """Group consecutive parameters into buckets of at most ``bucket_bytes``.

    Args:
        sizes: bytes of each parameter, in model order.
        bucket_bytes: the most bytes one bucket holds (a larger parameter gets a
            bucket of its own).

    Returns:
        ``[(first, end), ...]``: half-open index ranges into ``sizes``, covering
        every parameter once, in order.

    Raises:
        ValueError: ``bucket_bytes`` < 1 or a negative size.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    ranges: list[tuple[int, int]] = []
    first, filled = 0, 0
    for i, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"parameter {i} has a negative size {size}")
        if i > first and filled + size > bucket_bytes:
            ranges.append((first, i))
            first, filled = i, 0
        filled += size
    if first < len(sizes):
        ranges.append((first, len(sizes)))
    return ranges


@dataclass(frozen=True)
class WeightSyncPlan:
    """What one weight update moves.

    Attributes:
        bytes_per_update: bytes of the full weights in the model dtype (each
            generator receives all of them).
        bucket_bytes: the bucket size.
        buckets: collectives per update.
        generators: receivers.
        exact: True when the buckets were counted from the parameters' sizes,
            False when estimated from the total (ceil(bytes / bucket_bytes)).
    """

    bytes_per_update: int
    bucket_bytes: int
    buckets: int
    generators: int
    exact: bool

    def line(self) -> str:
        """One line for the dry run."""
        about = "" if self.exact else "about "
        return (f"weight sync: {bytes_text(self.bytes_per_update)} per update from trainer 0 to "
                f"{self.generators} generator(s), {about}{self.buckets} bucket(s) of at most "
                f"{self.bucket_bytes / 2**20:.0f} MiB (one broadcast each)")


def weight_sync_plan(params: int, dtype: str, generators: int, bucket_bytes: int = BUCKET_BYTES,
                     sizes: list[int] | None = None) -> WeightSyncPlan:
    """The plan for a model of ``params`` parameters in ``dtype``.

    Args:
        params: parameter count.
        dtype: ``fp32`` or ``bf16`` (the dtype the weights travel in: the model's).
        generators: receivers.
        bucket_bytes: bucket size.
        sizes: the parameters' sizes in bytes when known (exact bucket count).

    Raises:
        ValueError: unknown dtype.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    if sizes is not None:
        return WeightSyncPlan(sum(sizes), bucket_bytes, len(bucket_ranges(sizes, bucket_bytes)), generators, True)
    total = params * DTYPE_BYTES[dtype]
    return WeightSyncPlan(total, bucket_bytes, max(1, math.ceil(total / bucket_bytes)), generators, False)
