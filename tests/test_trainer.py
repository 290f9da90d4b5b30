"""The DeepSpeed policy trainer on CPU: a real step, and micro-batching that does not change it."""

from __future__ import annotations

import torch

from scalectl.recipe import Loss, Optim
from scalectl.rl.model import build_tiny_model
from scalectl.rl.trainer import PolicyTrainer, TrainBatch


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    N, P, T = 4, 3, 5
    ids = torch.randint(3, 20, (N, P + T), generator=g)
    mask = torch.ones(N, T)
    mask[1, 3:] = 0
    mask[3, 1:] = 0
    return TrainBatch(ids, torch.ones_like(ids), P - 1, mask, torch.full((N, T), -3.0),
                      torch.tensor([1.0, -1.0, 0.5, -0.5]), torch.tensor([0, 0, 1, 1]))


def _trained_params(micro_batch_size: int, loss: Loss):
    # Adam is invariant to the gradient's scale unless eps dominates: with eps = 1 and
    # lr = 1 the first update is g / (|g| + 1) ~ g, so a loss-scale bug would show.
    torch.manual_seed(0)
    model = build_tiny_model(seed=0)
    trainer = PolicyTrainer(model, loss=loss, optim=Optim(lr=1.0, warmup_steps=0, eps=1.0, weight_decay=0.0, grad_clip=None),
                            head_fp32=True, temperature=1.0, micro_batch_size=micro_batch_size)
    metrics = trainer.train_step(_batch())
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters()}, metrics, trainer


def test_micro_batching_gives_the_same_step():
    """Gradient accumulation must not change the effective loss scale (recipe-axes.md)."""
    for loss in (Loss(type="cispo", aggregation="prompt"), Loss(type="ppo_clip", aggregation="sample")):
        full, m_full, trainer = _trained_params(4, loss)
        split, m_split, _ = _trained_params(1, loss)
        assert trainer.steps == 1
        assert abs(m_full["loss"] - m_split["loss"]) < 1e-6
        for name in full:
            torch.testing.assert_close(full[name], split[name], rtol=0, atol=1e-7)
        start = {k: v for k, v in build_tiny_model(seed=0).named_parameters()}
        moved = max((full[k] - start[k].detach()).abs().max().item() for k in full)
        assert moved > 1e-5   # the step did update the weights
