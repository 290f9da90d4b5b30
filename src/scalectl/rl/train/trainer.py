"""The policy trainer: a DeepSpeed engine taking one RL optimiser step per batch.

On a GPU the engine runs with NCCL and the setup's ZeRO stage; on a CPU
DeepSpeed picks its CPU accelerator and the gloo backend.  The optimiser is a
torch AdamW (its fused kernel where torch has one for the device: :func:`adamw_kernel`)
handed to DeepSpeed, so nothing is compiled; the learning rate is
constant after a linear warm-up (ScaleRL appendix A.3).

With N data-parallel trainers each rank trains on its share of the step's
batch (whole groups) and every normaliser is the whole batch's
(:mod:`scalectl.rl.train.sharding`), so the update is the 1-trainer update.

Gradient accumulation never changes the loss scale: the aggregation weights
are computed once over the whole batch (:func:`scalectl.rl.train.losses.aggregation_weights`),
each micro-batch's loss is its share of the batch loss, the engine's own
division by the accumulation count is switched off (``scale_wrt_gas=False``),
and ``step()`` is called once per batch.

Gradient clipping and the logged ``grad_norm`` are one number on every path:
with ZeRO 0 in float32 DeepSpeed would clip without recording the norm, so the
trainer clips there itself (``torch.nn.utils.clip_grad_norm_``, after the
gradients are all-reduced) and logs the norm it clipped by; with bf16 or ZeRO
>= 1 DeepSpeed's optimiser wrapper clips and records the same global norm
(``get_global_grad_norm``).  A step's metrics describe that step: the learning
rate is the one the optimiser applied, read before the scheduler advances.

No compute goes to padding where it can be avoided: completions with advantage 0
and all-padding columns are cut (:func:`gradient_rows`), and each micro-batch's
remaining sequences are packed several to a row (:mod:`scalectl.rl.train.packing`,
``pack=True``) when that takes fewer rows and every layer of the model isolates the
sequences of a packed row (:func:`scalectl.rl.train.packing.packing_support`: not so for
linear-attention, convolution and state-space layers, whose state runs along the row; such
models train on the padded rows, and :attr:`PolicyTrainer.packing` says which and why); the
log-probs come back in the padded (N, T) layout either way, so the loss code is the same on
both paths.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

import torch

from scalectl.rl.train.losses import aggregation_weights, get_policy_loss
from scalectl.rl.policy.logprobs import packed_token_logprobs, route_head_through_module, token_logprobs
from scalectl.rl.train.packing import PackingSupport, packing_support, pack as pack_rows


def import_deepspeed(device: str):
    """DeepSpeed, with its CPU accelerator named (``DS_ACCELERATOR=cpu``, unless set) when the
    policy trains on a CPU: DeepSpeed then takes it without looking for a GPU, which it reported
    in every run as "[WARNING] ... Setting accelerator to CPU" although nothing was wrong."""
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    return deepspeed


def init_distributed_env() -> None:
    """Join torch.distributed for DeepSpeed.

    A multi-process job has its rendezvous in the environment (torchrun,
    Slurm, :mod:`scalectl.rl.transport.roles`: MASTER_ADDR/PORT, RANK, WORLD_SIZE,
    LOCAL_RANK) and DeepSpeed joins it.  A single-process world (WORLD_SIZE
    unset or 1) needs no rendezvous: its process group is made here over an
    in-process ``HashStore``, so no TCP port is taken (a port picked free and
    bound later can be taken by another process in between, EADDRINUSE), and
    DeepSpeed uses that group.  The variables DeepSpeed checks are still set,
    so it does not look for MPI.

    The group made here is destroyed at interpreter exit (``atexit``): a gloo
    group left to interpreter teardown can still hold asynchronous work (ZeRO-3's
    gathers) whose release then aborts the process ("terminate called without an
    active exception", exit status 134) after the run has finished.
    """
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "0")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    if os.environ["WORLD_SIZE"] == "1" and not dist.is_initialized():
        from deepspeed.accelerator import get_accelerator

        dist.init_process_group(get_accelerator().communication_backend_name(),
                                store=dist.HashStore(), rank=0, world_size=1)
        atexit.register(_destroy_default_group)


def _destroy_default_group() -> None:
    """Destroy torch.distributed's default group if it still exists (an ``atexit`` handler)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def adamw_kernel(params: list) -> dict:
    """torch AdamW's implementation for ``params``: ``{"fused": True}`` (one kernel over every
    parameter per step) where torch has a fused AdamW for their device and floating dtype (CPU
    and CUDA in torch >= 2.4: the same update, Loshchilov & Hutter 2019, up to float rounding;
    about 4x faster than the per-tensor loop at 1 M parameters here, ``benchmarks/README.md``),
    else ``{}`` (torch's default, ``foreach`` where it applies)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        devices = set(_get_fused_kernels_supported_devices())
    except ImportError:
        return {}
    ok = params and all(p.device.type in devices and p.dtype in (torch.float32, torch.float16, torch.bfloat16)
                        for p in params)
    return {"fused": True} if ok else {}


@dataclass
class TrainBatch:
    """One optimiser step's data, padded to a rectangle.

    Shapes: N completions, L = prompt + completion columns (left padded so
    every completion starts at column ``start + 1``).

    Attributes:
        input_ids: (N, L) long.
        attention_mask: (N, L) long.
        start: index of the last prompt column; completion token t sits at
            column start + 1 + t, and its log-prob at output column t.
        loss_mask: (N, T) float, 1 on completion tokens that are trained
            (0 on padding and on forced tokens such as the interruption phrase).
        gen_logp: (N, T) generator log-probs recorded at sampling time.
        advantages: (N,).
        group_ids: (N,) long, the group (prompt) of each completion.
        totals: when this is one trainer's share of a step's batch, the whole
            batch's aggregation normalisers (:class:`scalectl.rl.train.sharding.BatchTotals`);
            None when it is the whole batch.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    start: int
    loss_mask: torch.Tensor
    gen_logp: torch.Tensor
    advantages: torch.Tensor
    group_ids: torch.Tensor
    totals: object = None

    def to(self, device) -> "TrainBatch":
        """The batch with its tensors on ``device`` (itself when they are there already)."""
        if self.input_ids.device == torch.device(device):
            return self
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        return TrainBatch(**moved)

    @property
    def n_tokens(self) -> int:
        """Trained completion tokens."""
        return int(self.loss_mask.sum().item())


def gradient_rows(batch: TrainBatch, weights: torch.Tensor) -> tuple[TrainBatch, torch.Tensor]:
    """The part of a padded batch that carries gradient, with its aggregation weights.

    Keeps the completions whose advantage is not 0 (at least one, so an optimiser step
    still sees a backward pass), then cuts the columns that are padding in every kept
    completion: leading prompt columns with attention 0 (positions come from the
    attention mask, :func:`scalectl.rl.policy.logprobs.position_ids_from_mask`, so the kept tokens
    keep theirs) and trailing completion columns past the last trained token of the kept
    completions (a causal model's earlier outputs do not depend on them).

    Args:
        batch: a :class:`TrainBatch` of N completions, L columns, T completion columns.
        weights: (N, T) aggregation weights computed on the whole batch.

    Returns:
        (batch', weights'): N' <= N rows, L' <= L columns, T' <= T completion columns;
        ``batch`` itself when nothing can be cut.
    """
    keep = torch.nonzero(batch.advantages != 0).flatten()
    if keep.numel() == 0:
        keep = torch.arange(min(1, batch.advantages.numel()))
    attention = batch.attention_mask[keep]
    used = torch.nonzero(attention.any(dim=0)).flatten()
    first = int(used[0]) if used.numel() else 0
    first = min(first, batch.start)   # the last prompt column (its output predicts token 0) stays
    mask = batch.loss_mask[keep]
    trained = torch.nonzero(mask.any(dim=0)).flatten()
    t_kept = int(trained[-1]) + 1 if trained.numel() else 1
    n, T = batch.input_ids.shape[0], batch.loss_mask.shape[1]
    if keep.numel() == n and first == 0 and t_kept == T:
        return batch, weights
    cols = slice(first, batch.start + 1 + t_kept)
    return TrainBatch(
        input_ids=batch.input_ids[keep][:, cols], attention_mask=attention[:, cols], start=batch.start - first,
        loss_mask=mask[:, :t_kept], gen_logp=batch.gen_logp[keep][:, :t_kept],
        advantages=batch.advantages[keep], group_ids=batch.group_ids[keep], totals=batch.totals,
    ), weights[keep][:, :t_kept]


class TokenLogprobs(torch.nn.Module):
    """The module DeepSpeed wraps: the policy's backbone and head (the same module objects, so
    the same parameter names and checkpoints as the causal LM), whose forward is
    :func:`scalectl.rl.policy.logprobs.token_logprobs` (padded rows) or
    :func:`scalectl.rl.policy.logprobs.packed_token_logprobs` (packed rows).  Every micro-batch then runs through the
    engine's ``forward`` (ZeRO's per-micro-batch bookkeeping, e.g. ZeRO-3 accumulating
    rather than overwriting the gradients of earlier micro-batches, and gathering the
    head's weight in a module call).

    Args:
        policy: a causal LM with ``.model`` and ``.lm_head``.
    """

    def __init__(self, policy):
        super().__init__()
        self.model, self.lm_head = policy.model, policy.lm_head
        self.config = policy.config

    def forward(self, input_ids, attention_mask, *, head_fp32: bool, temperature: float, start: int,
                with_entropy: bool = True, position_ids=None, index=None, targets=None):
        """(logp, entropy), each (N, L - 1 - start): :func:`scalectl.rl.policy.logprobs.token_logprobs` of
        padded rows; with ``index``, :func:`scalectl.rl.policy.logprobs.packed_token_logprobs` of packed
        rows (``input_ids`` and ``position_ids`` (R, C), ``attention_mask`` None, ``index`` and
        ``targets`` (N, T); ``start`` unused)."""
        if index is not None:
            return packed_token_logprobs(self, input_ids, position_ids, index, targets, head_fp32=head_fp32,
                                         temperature=temperature, with_entropy=with_entropy)
        return token_logprobs(self, input_ids, attention_mask, head_fp32=head_fp32, temperature=temperature,
                              start=start, with_entropy=with_entropy)


class PolicyTrainer:
    """A DeepSpeed engine over the policy, with the recipe's loss and schedule.

    Args:
        model: the causal LM (transformers), already in the training dtype.
        loss: a :class:`scalectl.recipe.schema.Loss` section.
        optim: a :class:`scalectl.recipe.schema.Optim` section.
        head_fp32: compute the LM head and log-softmax in float32.
        temperature: the sampling temperature the generator log-probs refer to.
        micro_batch_size: completions per forward/backward.
        zero_stage: DeepSpeed ZeRO stage (0-3).
        pack: pack each micro-batch's sequences several to a row (:mod:`scalectl.rl.train.packing`)
            when that takes fewer rows and every layer of ``model`` isolates packed sequences
            (:func:`scalectl.rl.train.packing.packing_support`); False: always the padded rows.

    Attributes:
        packing: a :class:`scalectl.rl.train.packing.PackingSupport`: whether this trainer packs,
            and why (one line for the run log).
    """

    def __init__(self, model, *, loss, optim, head_fp32: bool, temperature: float,
                 micro_batch_size: int, zero_stage: int = 0, dtype: str = "fp32", pack: bool = True):
        deepspeed = import_deepspeed(next(model.parameters()).device.type)
        init_distributed_env()
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # skip a 27 s compile on CPU
        self.loss_cfg = loss
        self.loss_fn = get_policy_loss(loss.type)
        self.head_fp32 = head_fp32
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.packing = packing_support(model.config) if pack else PackingSupport(False, "padded rows: packing is off")
        self.pack = self.packing.packs
        route_head_through_module(model)     # ZeRO-3 gathers the head's weight only in a module call
        optimizer = torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=(optim.beta1, optim.beta2),
                                      eps=optim.eps, weight_decay=optim.weight_decay,
                                      **adamw_kernel(list(model.parameters())))
        warmup = optim.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0)
        config = {
            "train_micro_batch_size_per_gpu": micro_batch_size,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": zero_stage},
            "bf16": {"enabled": dtype == "bf16"},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.grad_clip = optim.grad_clip
        # fp32 without ZeRO: DeepSpeed clips with torch but keeps no norm; clip here instead
        self.clips_itself = zero_stage == 0 and dtype == "fp32"
        if optim.grad_clip is not None and not self.clips_itself:
            config["gradient_clipping"] = optim.grad_clip
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=TokenLogprobs(model), optimizer=optimizer, lr_scheduler=scheduler, config=config)
        self.model = model

    @property
    def steps(self) -> int:
        """Optimiser steps taken so far."""
        return int(self.engine.global_steps)

    def train_step(self, batch: TrainBatch) -> dict:
        """One optimiser step on ``batch`` (micro-batched), returning metrics.

        Only the work that carries gradient is computed (:func:`gradient_rows`): completions
        whose advantage is exactly 0 never reach the forward or backward pass (every policy
        loss here is ``A`` times a function of the ratio, with no KL or entropy term, so
        their loss and gradient are exactly 0), and the columns that are padding in every
        remaining completion are cut.  The aggregation weights are computed on the whole
        batch first, so the skipped completions still count in the normalisers and the
        loss and gradient equal those of the full padded batch.  With ``pack`` the padding
        left inside the rows is not computed either: each micro-batch's sequences go
        several to a row (:func:`scalectl.rl.train.packing.pack`) when that takes fewer rows, and
        the log-probs come back in the padded layout, so the loss is unchanged.

        Returns:
            loss, clip_fraction, entropy (mean over trained tokens of the completions that
            went through the pass, nats), logprob_mismatch (mean |log pi_train - log pi_gen|, same
            tokens), max_ratio, lr (the learning rate this step applied), grad_norm (the
            global L2 norm of the gradient before clipping: the norm ``optim.grad_clip`` is
            compared with), rows and columns (the completions and the token columns of their
            padded rectangle that went through the passes; a packed row has as many columns),
            token_cells (the rows x columns the passes computed: packed rows count as rows,
            and the zero-gradient passes of a short data-parallel share count too).

        Raises:
            ValueError: with ``pack``, a row whose real tokens are not one run of columns
                through column ``start`` (:func:`scalectl.rl.train.packing.sequence_spans`).
            RuntimeError: DeepSpeed recorded no gradient norm.
        """
        self.engine.train()
        batch = batch.to(self.engine.device)
        weights = aggregation_weights(batch.loss_mask, batch.group_ids, self.loss_cfg.aggregation,
                                      totals=batch.totals)
        batch, weights = gradient_rows(batch, weights)
        # DeepSpeed averages the gradients of its data-parallel ranks; the weights already divide by the
        # whole batch's normalisers, so the batch gradient is the ranks' SUM: undo the average.
        ranks = self.engine.dp_world_size
        n = batch.input_ids.shape[0]
        totals = {"loss": 0.0, "clip_fraction": 0.0, "entropy": 0.0, "logprob_mismatch": 0.0}
        max_ratio = 0.0
        tokens_total = max(batch.n_tokens, 1)
        chunks = list(range(0, n, self.micro_batch_size))
        passes = self._passes(len(chunks), ranks)
        cells = 0
        for i, lo in enumerate(chunks):
            hi = min(lo + self.micro_batch_size, n)
            self.engine.set_gradient_accumulation_boundary(i == passes - 1)
            logp, entropy, computed = self._forward(batch.input_ids[lo:hi], batch.attention_mask[lo:hi], batch.start)
            cells += computed
            mask = batch.loss_mask[lo:hi]
            loss, metrics = self.loss_fn(
                logp, batch.gen_logp[lo:hi], batch.advantages[lo:hi], mask, weights[lo:hi],
                clip_low=self.loss_cfg.clip_low, clip_high=self.loss_cfg.clip_high)
            self.engine.backward(loss * ranks if ranks > 1 else loss, scale_wrt_gas=False)
            share = float(mask.sum()) / tokens_total
            totals["loss"] += float(loss.detach())
            totals["clip_fraction"] += metrics["clip_fraction"] * share
            totals["logprob_mismatch"] += metrics["logprob_mismatch"] * share
            totals["entropy"] += float((entropy.detach() * mask).sum()) / tokens_total
            max_ratio = max(max_ratio, metrics["ratio_max"])
        for i in range(len(chunks), passes):   # a shorter share than another rank's: zero-gradient passes
            self.engine.set_gradient_accumulation_boundary(i == passes - 1)
            cells += self._empty_pass()
        # read before step(): the scheduler advances inside it, to the next step's rate
        totals["lr"] = float(self.engine.optimizer.param_groups[0]["lr"])
        own_norm = self._clip() if self.clips_itself else None
        self.engine.step()
        totals["max_ratio"] = max_ratio
        norm = own_norm if self.clips_itself else self.engine.get_global_grad_norm()
        if norm is None:
            raise RuntimeError("DeepSpeed recorded no gradient norm on this optimiser path "
                               f"({type(self.engine.optimizer).__name__})")
        totals["grad_norm"] = float(norm)
        totals["rows"], totals["columns"] = n, int(batch.input_ids.shape[1])
        totals["token_cells"] = cells
        if ranks > 1:     # the metrics of the whole batch, not of this rank's share
            from scalectl.rl.train.sharding import allreduce_max, allreduce_sum, batch_metrics

            group = self.engine.data_parallel_group
            totals = batch_metrics(totals, float(batch.n_tokens), allreduce_sum(group), allreduce_max(group))
        return totals

    def _forward(self, input_ids, attention_mask, start: int):
        """One micro-batch's forward through the engine: (logp (n, T), entropy (n, T), cells
        computed), packed when the model allows it (:attr:`packing`) and packing takes fewer
        rows, else padded."""
        if self.pack:
            packed = pack_rows(input_ids, attention_mask, start, input_ids.shape[1] - 1 - start)
            if packed.rows < input_ids.shape[0]:
                logp, entropy = self.engine(packed.input_ids, None, head_fp32=self.head_fp32,
                                            temperature=self.temperature, start=start,
                                            position_ids=packed.position_ids, index=packed.index,
                                            targets=input_ids[:, start + 1:])
                return logp, entropy, packed.input_ids.numel()
        logp, entropy = self.engine(input_ids, attention_mask, head_fp32=self.head_fp32,
                                    temperature=self.temperature, start=start)
        return logp, entropy, input_ids.numel()

    def _passes(self, chunks: int, ranks: int) -> int:
        """The forward/backward passes every data-parallel rank runs this step: the most
        micro-batches of any rank.  ZeRO-2 reduces gradients and ZeRO-3 gathers parameters and
        reduces gradients in every pass, so a rank with a shorter share (fewer completions
        carry gradient there) must run as many passes, or the ranks' collectives mismatch."""
        if ranks == 1:
            return max(chunks, 1)
        from scalectl.rl.train.sharding import allreduce_max

        most = allreduce_max(self.engine.data_parallel_group)(torch.tensor(float(chunks)))
        return max(int(most.item()), 1)

    def _empty_pass(self) -> int:
        """One forward/backward with zero gradient (a one-token input, loss times 0): it takes
        part in every collective of a real pass.  Returns the cells it computed (2)."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.engine.device)
        logp, _ = self.engine(ids, torch.ones_like(ids), head_fp32=self.head_fp32,
                              temperature=self.temperature, start=0)
        self.engine.backward(logp.sum() * 0.0, scale_wrt_gas=False)
        return ids.numel()

    def _clip(self) -> float:
        """Clip the (all-reduced) gradients to ``optim.grad_clip`` (none: only measure) and
        return their global L2 norm before clipping."""
        params = [p for p in self.engine.module.parameters() if p.grad is not None]
        max_norm = self.grad_clip if self.grad_clip is not None else float("inf")
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def state_dict(self) -> dict:
        """The policy's weights (for the rollout engine and checkpoints)."""
        return self.model.state_dict()

    def gathered(self, fn=None):
        """``fn(model)`` with the full parameters (None: only take part in the gathering).

        Under ZeRO-3 each rank holds a partition of every parameter; DeepSpeed's
        ``zero.GatheredParameters`` all-gathers them over the trainers' group for the call
        (every trainer rank must call this together) and partitions them again after it
        (changes made inside are dropped).  At other stages the parameters are whole and
        nothing is communicated.

        Returns:
            What ``fn`` returns (None without ``fn``).
        """
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None):
            return fn(self.model) if fn is not None else None

    def save(self, folder: str) -> None:
        """Save engine, optimiser and scheduler state under ``folder``."""
        self.engine.save_checkpoint(folder, tag="latest", save_latest=False)

    def load(self, folder: str) -> None:
        """Load what :meth:`save` wrote."""
        self.engine.load_checkpoint(folder, tag="latest", load_optimizer_states=True,
                                    load_lr_scheduler_states=True)
