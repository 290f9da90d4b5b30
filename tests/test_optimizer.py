"""The trainer's optimiser: torch's fused AdamW where torch has one for the parameters' device
(:func:`scalectl.rl.train.trainer.adamw_kernel`), the same update as AdamW's formula.

Tolerance: one AdamW step from zero moments moves each weight by lr * (g / (|g| + eps) + wd * p)
(Loshchilov & Hutter 2019, Algorithm 2, with bias correction: m_hat = g, v_hat = g^2); in float32
the fused kernel and the formula round differently by a few ulps of the weights (|p| <= 2,
ulp 2.4e-7), so 2e-6 bounds the difference.
"""

from __future__ import annotations

import torch

from scalectl.recipe.schema import Loss, Optim
from scalectl.rl.policy.model import build_tiny_model
from scalectl.rl.train.trainer import PolicyTrainer, adamw_kernel


def test_fused_adamw_on_cpu_float_parameters_and_not_on_integers():
    assert adamw_kernel([torch.zeros(3), torch.zeros(2, dtype=torch.bfloat16)]) == {"fused": True}
    assert adamw_kernel([torch.zeros(3, dtype=torch.float64)]) == {}
    assert adamw_kernel([]) == {}


def test_the_trainers_optimiser_is_fused_and_steps_by_adamws_formula():
    model = build_tiny_model(seed=0, num_hidden_layers=1, hidden_size=32, intermediate_size=64)
    lr, wd, eps = 1e-3, 0.1, 1e-8
    trainer = PolicyTrainer(model, loss=Loss(type="cispo"), optim=Optim(lr=lr, warmup_steps=0, weight_decay=wd,
                                                                          eps=eps),
                            head_fp32=True, temperature=1.0, micro_batch_size=4)
    optimizer = trainer.engine.optimizer
    assert optimizer.param_groups[0]["fused"] is True
    gen = torch.Generator().manual_seed(3)
    before, grads = {}, {}
    for name, p in trainer.model.named_parameters():
        before[name] = p.detach().clone()
        grads[name] = torch.randn(p.shape, generator=gen)
        p.grad = grads[name].clone()
    optimizer.step()
    worst = 0.0
    for name, p in trainer.model.named_parameters():
        p0, g = before[name], grads[name]
        want = p0 * (1 - lr * wd) - lr * g / (g.abs() + eps)
        worst = max(worst, float((p.detach() - want).abs().max()))
    assert worst <= 2e-6
