"""One step's batch over N data-parallel trainers, with every batch-wide quantity kept batch-wide.

Each trainer rank trains on a share of the step's groups (whole groups, so a
group's mean reward is local), and DeepSpeed averages the ranks' gradients.
What is defined over the whole batch is computed from sums all-reduced over
the trainers, so that the gradient of an N-trainer step equals the 1-trainer
gradient on the same batch:

* the batch-level advantage std (ScaleRL's ``batch`` normalisation,
  :func:`scalectl.rl.train.advantages.group_advantages`): from the all-reduced sum,
  count and squared deviations of the centred rewards;
* the aggregation normalisers (:func:`scalectl.rl.train.losses.aggregation_weights`):
  ``sample`` divides by the batch's completions, ``prompt`` by its groups,
  ``token`` by its tokens (:class:`BatchTotals`); a group's own token count is
  local, since a group never straddles two ranks;
* the average DeepSpeed takes over the ranks is undone by scaling each rank's
  loss by the number of ranks (:class:`scalectl.rl.train.trainer.PolicyTrainer`), so
  the update is the sum of the ranks' shares of the batch gradient.

A *reduce* is a function taking a float64 tensor and returning its elementwise
sum over the trainer ranks; None means one rank (the sum is the tensor itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

Reduce = Callable[[torch.Tensor], torch.Tensor]


def split_groups(n_groups: int, ranks: int) -> list[range]:
    """Contiguous shares of ``n_groups`` whole groups for ``ranks`` trainers; sizes differ by at most one
    (the first ``n_groups % ranks`` ranks take one more). A rank may get none when there are fewer
    groups than ranks (it still takes part in every all-reduce, with zero contribution).

    Raises:
        ValueError: ``ranks`` < 1 or ``n_groups`` < 0.
    """
    if ranks < 1 or n_groups < 0:
        raise ValueError(f"need ranks >= 1 and n_groups >= 0, got {ranks} and {n_groups}")
    base, extra = divmod(n_groups, ranks)
    shares, start = [], 0
    for r in range(ranks):
        size = base + (1 if r < extra else 0)
        shares.append(range(start, start + size))
        start += size
    return shares


def _allreduce(op: str, group=None) -> Reduce:
    """A reduce over ``group`` (default: the whole torch.distributed world) with ``op``
    (a ``torch.distributed.ReduceOp`` name); the input tensor is left unchanged."""
    import torch.distributed as dist

    def reduce(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        dist.all_reduce(y, op=getattr(dist.ReduceOp, op), group=group)
        return y

    return reduce


def allreduce_sum(group=None) -> Reduce:
    """Elementwise sum over ``group`` (default: the whole torch.distributed world)."""
    return _allreduce("SUM", group)


@dataclass(frozen=True)
class BatchTotals:
    """The batch-wide normalisers of the loss aggregation.

    Attributes:
        completions: completions in the whole step's batch (``sample``).
        groups: groups in it (``prompt``).
        tokens: trained tokens in it (``token``).
    """

    completions: int
    groups: int
    tokens: float


def batch_totals(mask: torch.Tensor, group_ids: torch.Tensor, reduce: Reduce | None = None) -> BatchTotals:
    """Completions, groups and trained tokens of the whole batch, from one rank's share.

    Args:
        mask: (N_r, T) this rank's loss mask.
        group_ids: (N_r,) this rank's group ids (whole groups).
        reduce: sum over the ranks (None: one rank).
    """
    local = torch.tensor([float(mask.shape[0]), float(torch.unique(group_ids).numel()),
                          float(mask.sum())], dtype=torch.float64)
    total = reduce(local) if reduce is not None else local
    return BatchTotals(int(round(total[0].item())), int(round(total[1].item())), float(total[2].item()))


def batch_std(a: torch.Tensor, reduce: Reduce | None = None) -> torch.Tensor:
    """Population std (divide by n) of ``a`` over the whole batch, from one rank's share.

    Two all-reduces in float64: the mean from (sum, count), then the mean squared
    deviation from it (the two-pass formula, no cancellation). With ``reduce`` None
    it is ``a.std(unbiased=False)``.

    Args:
        a: (N_r,) this rank's values.

    Returns:
        A 0-d tensor in ``a``'s dtype.
    """
    if reduce is None:
        return a.std(unbiased=False)
    s = reduce(torch.tensor([a.double().sum().item(), float(a.numel())], dtype=torch.float64))
    mean = s[0] / s[1].clamp(min=1)
    ss = reduce(((a.double() - mean) ** 2).sum().reshape(1))
    return (ss[0] / s[1].clamp(min=1)).sqrt().to(a.dtype)


#: Metrics of a trainer step that are means over the trained tokens (combined by token count).
TOKEN_MEANS = ("clip_fraction", "logprob_mismatch", "entropy")


def batch_metrics(local: dict, tokens: float, reduce: Reduce, reduce_max: Reduce) -> dict:
    """One trainer rank's step metrics made the whole batch's.

    ``loss`` is a sum over the batch (the aggregation weights already divide by the
    batch's normalisers), so the ranks' losses add up; the token means of
    :data:`TOKEN_MEANS` are combined weighted by each rank's trained tokens;
    ``max_ratio`` and ``columns`` take the maximum, ``rows`` and ``token_cells`` the sum. Other keys are
    kept as they are (``lr`` and ``grad_norm`` are the same on every rank).

    Args:
        local: this rank's metrics (:meth:`scalectl.rl.train.trainer.PolicyTrainer.train_step`).
        tokens: this rank's trained tokens behind the token means.
        reduce, reduce_max: sum and maximum over the trainer ranks.
    """
    out = dict(local)
    sums = torch.tensor([local["loss"], tokens, float(local.get("rows", 0)), float(local.get("token_cells", 0))]
                        + [local[k] * tokens for k in TOKEN_MEANS], dtype=torch.float64)
    sums = reduce(sums)
    out["loss"], all_tokens = float(sums[0]), float(sums[1])
    for i, k in enumerate(TOKEN_MEANS):
        out[k] = float(sums[4 + i]) / all_tokens if all_tokens > 0 else 0.0
    for i, k in ((2, "rows"), (3, "token_cells")):
        if k in local:
            out[k] = int(round(float(sums[i])))
    maxima = reduce_max(torch.tensor([local["max_ratio"], float(local.get("columns", 0))], dtype=torch.float64))
    out["max_ratio"] = float(maxima[0])
    if "columns" in local:
        out["columns"] = int(maxima[1])
    return out


def allreduce_max(group=None) -> Reduce:
    """Elementwise maximum over ``group`` (default: the whole world)."""
    return _allreduce("MAX", group)
