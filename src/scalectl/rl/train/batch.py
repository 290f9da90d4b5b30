"""Scored groups to a training batch: filter, advantages, padded tensors.

Order of operations per optimiser step (docs/recipe-axes.md):
1. zero-variance filter: groups whose G rewards are all equal are dropped
   (they would contribute zero advantage anyway); the batch is *not* refilled
   unless dynamic sampling asked for more groups beforehand;
2. advantages: group-centred, normalised per ``advantage.normalization``
   (:func:`scalectl.rl.train.advantages.group_advantages`) over the kept groups;
3. tensors: prompts left padded, completions right padded, so all completions
   start at one column and the trainer can skip the prompt columns.
"""

from __future__ import annotations

import torch

from scalectl.rl.train.advantages import group_advantages
from scalectl.rl.train.sharding import batch_totals
from scalectl.rl.train.trainer import TrainBatch


def keep_groups(groups: list, zero_variance: bool) -> list:
    """The groups that enter the loss: all, or those with reward variance."""
    return [g for g in groups if not (zero_variance and g.zero_variance)]


def build_train_batch(groups: list, normalization: str, pad_id: int, reduce=None) -> TrainBatch:
    """Stack kept groups into a :class:`TrainBatch`.

    Args:
        groups: kept :class:`scalectl.rl.rollout.groups.Group` objects (at least one, or none
            for a trainer rank whose share of a data-parallel step is empty).
        normalization: ``advantage.normalization`` (prompt | batch | none).
        pad_id: the tokenizer's padding id.
        reduce: when ``groups`` are one trainer's share of the step's batch (whole
            groups, :func:`scalectl.rl.train.sharding.split_groups`), the sum over the
            trainer ranks: the batch std of the advantages and the aggregation
            normalisers (``TrainBatch.totals``) are then the whole batch's.

    Returns:
        A batch of N = sum of group sizes completions; T = longest completion.

    Raises:
        ValueError: no groups (and no ``reduce``).
    """
    if not groups and reduce is None:
        raise ValueError("no groups to train on")
    if not groups:      # an empty share: still takes part in the batch-wide sums, then trains on nothing
        empty = torch.zeros(0)
        group_advantages(empty, torch.zeros(0, dtype=torch.long), normalization, reduce=reduce)
        mask = torch.zeros((0, 1))
        none = torch.zeros(0, dtype=torch.long)
        return TrainBatch(input_ids=torch.full((0, 2), pad_id, dtype=torch.long),
                          attention_mask=torch.zeros((0, 2), dtype=torch.long), start=0, loss_mask=mask,
                          gen_logp=torch.zeros((0, 1)), advantages=empty, group_ids=none,
                          totals=batch_totals(mask, none, reduce))
    comps = [c for g in groups for c in g.completions]
    group_ids = torch.tensor([i for i, g in enumerate(groups) for _ in g.completions])
    rewards = torch.cat([g.rewards for g in groups]).float()
    advantages = group_advantages(rewards, group_ids, normalization, reduce=reduce)
    P = max(len(c.prompt_ids) for c in comps)
    T = max(max(len(c.token_ids) for c in comps), 1)
    N = len(comps)
    input_ids = torch.full((N, P + T), pad_id, dtype=torch.long)
    attention = torch.zeros((N, P + T), dtype=torch.long)
    loss_mask = torch.zeros((N, T))
    gen_logp = torch.zeros((N, T))
    for i, c in enumerate(comps):
        p, t = len(c.prompt_ids), len(c.token_ids)
        input_ids[i, P - p:P] = torch.tensor(c.prompt_ids)
        input_ids[i, P:P + t] = torch.tensor(c.token_ids, dtype=torch.long)
        attention[i, P - p:P + t] = 1
        mask = getattr(c, "loss_mask", None)
        loss_mask[i, :t] = torch.tensor(mask, dtype=torch.float) if mask is not None else 1.0
        gen_logp[i, :t] = torch.tensor(c.logprobs, dtype=torch.float)
    totals = batch_totals(loss_mask, group_ids, reduce) if reduce is not None else None
    return TrainBatch(input_ids=input_ids, attention_mask=attention, start=P - 1, loss_mask=loss_mask,
                      gen_logp=gen_logp, advantages=advantages, group_ids=group_ids, totals=totals)
