"""One trainer rank of the data-parallel gradient check (run by tests/test_data_parallel.py).

``python tests/dp_worker.py RANK WORLD PORT OUT``: trains one step of the tiny
model on this rank's share of a fixed batch of groups, for every loss
aggregation and advantage normalisation (and twice with one group, so that
one of two ranks has an empty share), and saves the gradient of each step,
recovered from the first AdamW update, and its metrics to OUT.RANK.pt; then
three steps led through :class:`scalectl.rl.train.data_parallel.TrainerRanks`
(rank 0) and followed by the other ranks, with a checkpoint saved and loaded.

``python tests/dp_worker.py RANK WORLD PORT OUT STAGE``: the same gradient check at
ZeRO stage STAGE (every parameter partitioned at stage 3), two completions per
micro-batch, for a few combinations, where the ranks' shares keep different
numbers of completions (the all-wrong group has no gradient and leaves the
pass), so the ranks run different numbers of micro-batches.

Recovering the gradient: with lr = eps = C the first AdamW step moves each
parameter by u = C g / (|g| + C) (bias-corrected moments m = g, sqrt(v) = |g|),
so g = C u / (C - |u|) exactly.
"""

from __future__ import annotations

import os
import sys

import torch

C = 1.0
COMBOS = [(loss, agg, norm) for loss in ("cispo",) for agg in ("sample", "prompt", "token")
          for norm in ("prompt", "batch", "none")] + [("gspo", "prompt", "batch"), ("ppo_clip", "token", "batch")]


def make_groups(seed: int = 0, n_groups: int = 6, size: int = 4) -> list:
    """Groups of ``size`` completions of varied lengths and rewards (one group all wrong)."""
    from scalectl.rl.rollout.groups import Group
    from scalectl.rl.rollout.base import Completion

    g = torch.Generator().manual_seed(seed)
    groups = []
    for k in range(n_groups):
        prompt = torch.randint(4, 200, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        comps = []
        for _ in range(size):
            t = int(torch.randint(1, 9, (1,), generator=g))
            comps.append(Completion(prompt_index=k, prompt_ids=prompt,
                                    token_ids=torch.randint(4, 200, (t,), generator=g).tolist(),
                                    logprobs=(-3 * torch.rand(t, generator=g) - 2).tolist(), versions=[0] * t,
                                    finish_reason="stop", text="", loss_mask=[1] * t))
        rewards = torch.where(torch.rand(size, generator=g) < 0.5, 1.0, -1.0)
        if k == 2:
            rewards = torch.full((size,), -1.0)
        rewards = rewards - 0.25 * (k == 4) * torch.rand(size, generator=g)   # a shaped group
        groups.append(Group(k, comps, [bool(r > 0) for r in rewards], rewards))
    return groups


#: Steps where the batch is one group, so the second of two ranks trains on an empty share.
ONE_GROUP = [("cispo", "prompt", "batch"), ("cispo", "token", "none")]


#: Combinations checked at ZeRO stages 2 and 3.
ZERO_COMBOS = [("cispo", "prompt", "prompt"), ("cispo", "token", "batch")]


def main(rank: int, world: int, port: int, out: str, stage: int | None = None) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    from scalectl.recipe.schema import Loss, Optim
    from scalectl.rl.train.batch import build_train_batch
    from scalectl.rl.policy.model import build_tiny_model
    from scalectl.rl.train.sharding import allreduce_sum, split_groups
    from scalectl.rl.train.trainer import PolicyTrainer

    if stage is not None:
        partition_everything()
    grads, metrics = {}, {}
    combos = [(c, False) for c in COMBOS] + [(c, True) for c in ONE_GROUP]
    if stage is not None:
        combos = [(c, False) for c in ZERO_COMBOS] + [(ONE_GROUP[0], True)]
    for (loss, agg, norm), one in combos:
        model = build_tiny_model(seed=0)
        before = [p.detach().clone() for p in model.parameters()]
        trainer = PolicyTrainer(model, loss=Loss(type=loss, aggregation=agg),
                                optim=Optim(lr=C, warmup_steps=0, eps=C, weight_decay=0.0, grad_clip=None),
                                head_fp32=True, temperature=1.0, micro_batch_size=5 if stage is None else 2,
                                zero_stage=stage or 0)
        groups = make_groups()[4:5] if one else make_groups()       # group 4 has varied rewards
        share = split_groups(len(groups), world)[rank]
        batch = build_train_batch([groups[i] for i in share], norm, pad_id=0,
                                  reduce=allreduce_sum() if world > 1 else None)
        key = ("one-group/" if one else "") + f"{loss}/{agg}/{norm}"
        metrics[key] = trainer.train_step(batch)
        after = trainer.gathered(_flat)
        u = (torch.cat([b.flatten() for b in before]) - after).double()
        grads[key] = C * u / (C - u.abs())
    ranks = leader_and_followers(rank, out + ".ckpt") if stage is None else None
    torch.save({"grads": grads, "metrics": metrics, "ranks": ranks}, f"{out}.{rank}.pt")


def partition_everything() -> None:
    """Make DeepSpeed partition every parameter at ZeRO-3: it keeps tensors under
    ``stage3_param_persistence_threshold`` elements (1e5 by default: every tiny-model
    tensor) whole on every rank; 0 partitions them all."""
    import deepspeed

    initialize = deepspeed.initialize

    def initialize_partitioned(*args, config, **kwargs):
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return initialize(*args, config=config, **kwargs)

    deepspeed.initialize = initialize_partitioned


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def leader_and_followers(rank: int, ckpt: str) -> dict:
    """Rank 0 leads three steps through TrainerRanks (a checkpoint saved after the second and
    loaded after the third); other ranks follow."""
    from scalectl.recipe.schema import Loss, Optim
    from scalectl.rl.train.data_parallel import TrainerRanks, follow
    from scalectl.rl.policy.model import build_tiny_model
    from scalectl.rl.train.trainer import PolicyTrainer

    # lr = eps = 1: updates close to the gradient (a wrong gradient shows); grad_clip 0.05 is below
    # the gradients' norm here, so the global norm matters
    trainer = PolicyTrainer(build_tiny_model(seed=0), loss=Loss(type="cispo", aggregation="prompt"),
                            optim=Optim(lr=C, warmup_steps=0, eps=C, weight_decay=0.0, grad_clip=0.05),
                            head_fp32=True, temperature=1.0, micro_batch_size=5)
    if rank != 0:
        return {"steps": follow(trainer, "batch", pad_id=0), "loaded": _flat(trainer.model)}
    ranks = TrainerRanks(trainer, "batch", pad_id=0)
    metrics = [ranks.step(make_groups(seed=s)) for s in (0, 1)]
    ranks.save(ckpt)
    after_two = _flat(trainer.model)
    metrics.append(ranks.step(make_groups(seed=2)))
    after_three = _flat(trainer.model)
    ranks.load(ckpt)
    ranks.stop()
    return {"metrics": metrics, "after_two": after_two, "after_three": after_three,
            "loaded": _flat(trainer.model), "size": ranks.size}


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
         int(sys.argv[5]) if len(sys.argv) > 5 else None)
