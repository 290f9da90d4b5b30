"""Group-relative advantages.

A group is the G completions sampled for one prompt. Every completion gets one
advantage, shared by all its tokens: its reward minus the group's mean reward,
then optionally divided by a standard deviation (``advantage.normalization``).

Sources: GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, Sec. 4.1.2,
outcome supervision); Dr. GRPO (Liu et al. 2025, arXiv 2503.20783, Sec. 3.1:
no std division); ScaleRL (Khatri et al. 2025, arXiv 2510.13786, Sec. 3:
batch-level normalization).
"""

from __future__ import annotations

import torch

NORMALIZATIONS = ("prompt", "batch", "none")


def group_mean_std(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and population std (``unbiased=False``) of ``values`` over each row's group.

    Args:
        values: (N,) float.
        group_ids: (N,) long; rows with the same id form a group (ids need not be contiguous).

    Returns:
        (mean, std), both (N,): the statistics of row i's group, broadcast back to row i.
    """
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, inv, torch.ones_like(values))
    mean = torch.zeros_like(count).index_add_(0, inv, values) / count
    var = torch.zeros_like(count).index_add_(0, inv, (values - mean[inv]) ** 2) / count
    return mean[inv], var.sqrt()[inv]


def constant_groups(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Whether each row's group has one distinct value (its max equals its min).

    Args:
        values: (N,) float.
        group_ids: (N,) long.

    Returns:
        (N,) bool, broadcast back to the rows.
    """
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    empty = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    top = empty.scatter_reduce(0, inv, values, reduce="amax", include_self=False)
    bottom = empty.scatter_reduce(0, inv, values, reduce="amin", include_self=False)
    return (top == bottom)[inv]


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    normalization: str = "prompt",
    eps: float = 1e-6,
    reduce=None,
) -> torch.Tensor:
    """Advantage of each completion from its group's rewards.

    a_i = r_i - mean_{j in g(i)} r_j, then

    - ``prompt`` (GRPO): A_i = a_i / (std_{j in g(i)} r_j + eps)
    - ``batch`` (ScaleRL): A_i = a_i / (std_{all j in the batch} a_j + eps)
    - ``none`` (Dr. GRPO): A_i = a_i

    Both standard deviations are population stds (divide by n, ``unbiased=False``):
    a group of G = 2 with rewards (-1, +1) has std 1 and advantages (-1, +1).
    The batch std is taken over the centred a_j, so differences between the
    groups' mean rewards do not enter it. A group whose rewards are all equal
    (or of one completion) gets advantage exactly 0 under every normalization,
    whatever the reward value: its centred rewards are set to 0 rather than
    computed, since the float32 mean of n equal values need not equal them (16
    rewards of 0.8 leave a residue of ~6e-8, which divided by its own std + eps
    was an advantage of -0.1065).

    Args:
        rewards: (N,) reward of each completion (ints are cast to float32).
        group_ids: (N,) long, the group (prompt) of each completion.
        normalization: one of ``prompt``, ``batch``, ``none``.
        eps: added to the std before dividing.
        reduce: for a share of a batch split over trainer ranks by whole groups,
            the sum over the ranks (:mod:`scalectl.rl.train.sharding`); the ``batch``
            std is then the whole batch's. None: this is the whole batch.

    Returns:
        (N,) float advantages, without gradient.

    Raises:
        ValueError: unknown normalization, or shapes that are not (N,) and (N,).
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"advantage.normalization = {normalization!r} is not one of {', '.join(NORMALIZATIONS)}")
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both have shape (N,); got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    r = rewards.detach().float() if not rewards.is_floating_point() else rewards.detach()
    mean, std = group_mean_std(r, group_ids)
    a = torch.where(constant_groups(r, group_ids), torch.zeros_like(r), r - mean)
    if normalization == "prompt":
        return a / (std + eps)
    if normalization == "batch":
        from scalectl.rl.train.sharding import batch_std

        return a / (batch_std(a, reduce) + eps)
    return a
