"""The DeepSpeed policy trainer on CPU: a real step, and micro-batching that does not change it."""

from __future__ import annotations

import pytest
import torch

from scalectl.recipe.schema import Loss, Optim
from scalectl.rl.policy.model import build_tiny_model
from scalectl.rl.train.trainer import PolicyTrainer, TrainBatch


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
    """Gradient accumulation must not change the effective loss scale (docs/recipe-axes.md)."""
    for loss in (Loss(type="cispo", aggregation="prompt"), Loss(type="ppo_clip", aggregation="sample")):
        full, m_full, trainer = _trained_params(4, loss)
        split, m_split, _ = _trained_params(1, loss)
        assert trainer.steps == 1
        start = {k: v for k, v in build_tiny_model(seed=0).named_parameters()}
        moved = max((full[k] - start[k].detach()).abs().max().item() for k in full)
        assert 1e-5 < moved < 0.05   # the step did update the weights; every |g| = u / (1 - u) < 0.053
        # Tolerances from the arithmetic.  Both runs sum the same float32 terms in another order
        # (per micro-batch, then accumulated; other matmul blockings; other thread counts), and a
        # float32 sum of n terms is off by at most (n - 1) * 2^-24 * sum|terms|.  The loss and each
        # gradient entry sum at most N x T = 4 x 5 = 20 token terms, with sum|terms| < 1 here
        # (every |g| < 0.053, asserted just above), so they differ by at most 19 * 2^-24 = 1.13e-6.
        # The first AdamW step (lr = 1, eps = 1) moves p by u = g / (|g| + 1), and |du/dg| <= 1, so
        # the updates differ by no more than the gradients.  Then p0 - u is rounded to float32 in
        # each run, half an ulp each: one ulp of |p| together, at most 2^-23 * |p| (rtol).  That ulp
        # is 1.19e-7 for the norm weights near 1.0, which a 1e-7 atol alone did not allow.
        # The loss's token terms |rho A log pi| are below 8 (|A| <= 1, rho near 1 on the first
        # step, log-probs of the tiny model's small vocabulary above -8): 8 times that bound.
        sum_bound = 19 * 2.0**-24
        assert abs(m_full["loss"] - m_split["loss"]) <= 8 * sum_bound
        for name in full:
            torch.testing.assert_close(full[name], split[name], rtol=2.0**-23, atol=sum_bound)


def _small():
    return build_tiny_model(seed=0, num_hidden_layers=1, hidden_size=32, intermediate_size=64)


def _reference_grads(loss_cfg: Loss, batch: TrainBatch) -> dict:
    """The batch loss's gradient by plain torch autograd (one pass, no DeepSpeed), float32."""
    from scalectl.rl.train.losses import aggregation_weights, get_policy_loss
    from scalectl.rl.policy.logprobs import token_logprobs

    model = _small().train()
    weights = aggregation_weights(batch.loss_mask, batch.group_ids, loss_cfg.aggregation)
    logp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, start=batch.start, with_entropy=False)
    loss, _ = get_policy_loss(loss_cfg.type)(logp, batch.gen_logp, batch.advantages, batch.loss_mask, weights,
                                             clip_low=loss_cfg.clip_low, clip_high=loss_cfg.clip_high)
    loss.backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("zero_stage, dtype", [(0, "fp32"), (0, "bf16"), (1, "fp32"), (2, "fp32"), (3, "fp32")])
def test_grad_norm_is_logged_on_every_optimiser_path(zero_stage, dtype):
    """DeepSpeed records its global norm only on some paths (bf16, ZeRO >= 1); the default
    (fp32, ZeRO 0) logged None.  Every path must log the norm of the batch gradient, summed
    over two micro-batches (ZeRO-3 kept only the last one's gradient when the forward passes
    did not go through the engine, and could not read its partitioned LM head at all)."""
    loss = Loss()
    ref = _reference_grads(loss, _batch())
    ref_norm = torch.sqrt(sum((g.double() ** 2).sum() for g in ref.values())).item()
    model = _small()
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    trainer = PolicyTrainer(model, loss=loss, optim=Optim(lr=1e-4, warmup_steps=0, grad_clip=1.0), head_fp32=True,
                            temperature=1.0, micro_batch_size=2, zero_stage=zero_stage, dtype=dtype)
    norm = trainer.train_step(_batch())["grad_norm"]
    # fp32: one summation order against another (~1e-6 relative); bf16 weights and activations:
    # 8-bit mantissa, relative error of a few 2^-8 in the gradient
    assert norm == pytest.approx(ref_norm, rel=1e-4 if dtype == "fp32" else 3e-2)


def test_the_logged_norm_is_the_one_clipping_uses():
    """fp32, ZeRO 0, lr 1, Adam eps 1 (update g / (|g| + 1) on the first step, so the gradient's
    scale shows): clip at a quarter of the norm, and the update is that of g * max_norm / norm."""
    loss = Loss()
    ref = _reference_grads(loss, _batch())
    ref_norm = torch.sqrt(sum((g.double() ** 2).sum() for g in ref.values())).item()
    clip = ref_norm / 4
    model = _small()
    start = {k: p.detach().clone() for k, p in model.named_parameters()}
    trainer = PolicyTrainer(model, loss=loss, optim=Optim(lr=1.0, warmup_steps=0, eps=1.0, weight_decay=0.0,
                                                          grad_clip=clip),
                            head_fp32=True, temperature=1.0, micro_batch_size=2)
    metrics = trainer.train_step(_batch())
    assert metrics["grad_norm"] == pytest.approx(ref_norm, rel=1e-4)
    coef = clip / (metrics["grad_norm"] + 1e-6)       # torch.nn.utils.clip_grad_norm_
    for name, p in trainer.model.named_parameters():
        g = ref[name] * coef
        expected = start[name] - g / (g.abs() + 1.0)
        # float32 parameters of size ~0.02-1, updates below 1: a few ulps of the step's arithmetic
        torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-5)


def test_logged_learning_rate_is_the_one_the_step_applied():
    """5 warm-up steps to 1e-4: step k applies and logs k/5 * 1e-4.  The applied rate is read from
    the first update: AdamW's first step moves each parameter by lr * g / (|g| + eps), i.e. by lr
    up to eps / |g| (eps 1e-12 here)."""
    model = _small()
    start = {k: p.detach().clone() for k, p in model.named_parameters()}
    trainer = PolicyTrainer(model, loss=Loss(), optim=Optim(lr=1e-4, warmup_steps=5, eps=1e-12, weight_decay=0.0,
                                                            grad_clip=None),
                            head_fp32=True, temperature=1.0, micro_batch_size=4)
    first = trainer.train_step(_batch())
    moved = max((p.detach() - start[k]).abs().max().item() for k, p in trainer.model.named_parameters())
    # float32 parameters up to ~1 (the norms' weights): p - lr rounds to half an ulp, 6e-8 at most
    assert moved == pytest.approx(2e-5, abs=1.2e-7)
    assert first["lr"] == pytest.approx(2e-5, rel=1e-12)
    rates = [first["lr"]] + [trainer.train_step(_batch(seed=s))["lr"] for s in range(1, 7)]
    assert rates == pytest.approx([2e-5, 4e-5, 6e-5, 8e-5, 1e-4, 1e-4, 1e-4], rel=1e-12)


def _padded_batch_with_zero_advantages() -> TrainBatch:
    """6 completions in 3 groups; rows 1, 4 and 5 have advantage 0 (group 2 entirely); every
    row has 2 leading columns of prompt padding, and the kept rows end 2 columns early."""
    g = torch.Generator().manual_seed(3)
    N, P, T = 6, 5, 7
    ids = torch.randint(3, 20, (N, P + T), generator=g)
    attention = torch.ones_like(ids)
    attention[:, :2] = 0          # left padding shared by every row
    attention[0, 2] = 0           # one prompt shorter still
    mask = torch.zeros(N, T)
    mask[0, :5] = 1
    mask[1, :7] = 1               # the longest completion has advantage 0
    mask[2, :3] = 1
    mask[2, 1] = 0                # a forced token inside a completion
    mask[3, :4] = 1
    mask[4, :6] = 1
    mask[5, :2] = 1
    attention[:, P:] = (mask > 0).long() | (torch.arange(T) < torch.tensor([5, 7, 3, 4, 6, 2])[:, None]).long()
    return TrainBatch(ids, attention, P - 1, mask, -2.0 - torch.rand(N, T, generator=g),
                      torch.tensor([0.8, 0.0, -1.2, 0.4, 0.0, 0.0]), torch.tensor([0, 0, 1, 1, 2, 2]))


@pytest.mark.parametrize("loss", [Loss(type="cispo", aggregation="prompt"), Loss(type="ppo_clip", aggregation="sample"),
                                  Loss(type="gspo", aggregation="token", clip_low=3e-4, clip_high=4e-4)])
def test_zero_advantage_rows_and_padding_skip_the_pass_but_not_the_gradient(loss):
    """The step computes only rows with a non-zero advantage and the columns they use, and
    its gradient is the full padded batch's."""
    from scalectl.rl.train.trainer import gradient_rows
    from scalectl.rl.train.losses import aggregation_weights

    batch = _padded_batch_with_zero_advantages()
    cut, w = gradient_rows(batch, aggregation_weights(batch.loss_mask, batch.group_ids, loss.aggregation))
    assert cut.input_ids.shape == (3, 3 + 5) and cut.start == 2 and cut.loss_mask.shape == (3, 5)
    assert torch.equal(cut.advantages, torch.tensor([0.8, -1.2, 0.4]))
    ref = _reference_grads(loss, batch)
    # lr 1, Adam eps 1, no clipping: the first update is u = g / (|g| + 1), so g = u / (1 - |u|)
    trainer = PolicyTrainer(_small(), loss=loss, optim=Optim(lr=1.0, warmup_steps=0, eps=1.0, weight_decay=0.0,
                                                            grad_clip=None),
                            head_fp32=True, temperature=1.0, micro_batch_size=2)
    start = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    metrics = trainer.train_step(batch)
    assert (metrics["rows"], metrics["columns"]) == (3, 8)
    for name, p in trainer.model.named_parameters():
        u = start[name] - p.detach()
        g = u / (1 - u.abs())
        # float32: each gradient entry is a sum of at most N*L = 72 products, reordered by
        # the cut; its rounding error is below 72 * 2^-24 * sum|terms| <= 72 * 2^-24 * 8 * max|g|
        # (terms bounded by the weights' sum 1 times the largest per-token derivative), and the
        # inversion g = u / (1 - |u|) adds a few ulp.
        tol = 72 * 2**-24 * 8 * max(ref[name].abs().max().item(), 1e-3) + 4 * 2**-24
        torch.testing.assert_close(g, ref.get(name, torch.zeros_like(g)), rtol=0, atol=tol)


def test_a_batch_without_gradient_still_takes_one_row():
    from scalectl.rl.train.trainer import gradient_rows

    batch = _padded_batch_with_zero_advantages()
    batch.advantages.zero_()
    cut, w = gradient_rows(batch, torch.ones_like(batch.loss_mask))
    assert cut.input_ids.shape[0] == 1 and w.shape == cut.loss_mask.shape


_BUSY_PORT_TRAINER = """
import os, torch
from scalectl.recipe.schema import Loss, Optim
from scalectl.rl.policy.model import build_tiny_model
from scalectl.rl.train.trainer import PolicyTrainer
torch.set_num_threads(1)
trainer = PolicyTrainer(build_tiny_model(seed=0), loss=Loss(type="cispo"), optim=Optim(),
                        head_fp32=True, temperature=1.0, micro_batch_size=2)
import torch.distributed as dist
print(dist.get_world_size(), trainer.steps)
"""


def test_a_single_process_trainer_takes_no_port(tmp_path):
    """A one-process world joins torch.distributed without a TCP rendezvous, so a port
    taken by another process (here: held open and listening) cannot make it fail with
    EADDRINUSE, as a port picked free and bound later could."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
        env["MASTER_PORT"] = str(busy.getsockname()[1])
        out = subprocess.run([sys.executable, "-c", _BUSY_PORT_TRAINER], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["1", "0"]


_GROUP_AT_EXIT = """
import atexit, torch
import torch.distributed as dist
from scalectl.recipe.schema import Loss, Optim
from scalectl.rl.policy.model import build_tiny_model
from scalectl.rl.train.trainer import PolicyTrainer
atexit.register(lambda: print("group at exit:", dist.is_initialized()))   # runs after later handlers
torch.set_num_threads(1)
PolicyTrainer(build_tiny_model(seed=0), loss=Loss(type="cispo"), optim=Optim(),
              head_fp32=True, temperature=1.0, micro_batch_size=2, zero_stage=3)
print("group made:", dist.is_initialized())
"""


def test_the_single_process_group_is_destroyed_before_the_interpreter_exits(tmp_path):
    """The one-process group the trainer makes is destroyed by an exit handler: a gloo group
    left to interpreter teardown can abort the finished process (exit status 134).  The
    checker's handler is registered first, so it runs last and sees the group gone."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run([sys.executable, "-c", _GROUP_AT_EXIT], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-2:] == ["group made: True", "group at exit: False"]


@pytest.mark.slow
def test_a_cpu_trainer_names_deepspeeds_cpu_accelerator_so_it_does_not_warn():
    """DeepSpeed imported as the trainer imports it on a CPU takes its CPU accelerator without
    the "Setting accelerator to CPU" warning that every run printed; imported bare, it warns."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}

    def stderr(code: str) -> str:           # DeepSpeed's logger writes to stdout
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              timeout=300, check=True)
        return proc.stdout + proc.stderr

    ours = stderr("from scalectl.rl.train.trainer import import_deepspeed\n"
                  "ds = import_deepspeed('cpu')\n"
                  "from deepspeed.accelerator import get_accelerator\n"
                  "assert get_accelerator().device_name() == 'cpu'")
    assert "Setting accelerator to CPU" not in ours
    if not torch.cuda.is_available():
        assert "Setting accelerator to CPU" in stderr("import deepspeed")
