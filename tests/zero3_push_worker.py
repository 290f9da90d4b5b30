"""One rank of the ZeRO-3 weight-push check (run by tests/test_broadcast.py).

``python tests/zero3_push_worker.py RANK PORT WEIGHTS_PORT OUT [MODEL]``: ranks 0 and 1 are two trainer
ranks (gloo, the default group), rank 2 a generator. For ZeRO stage 0 and then 3, the trainers
build the tiny model (seed 0; MODEL ``moe``: the tiny mixture of experts,
:func:`scalectl.rl.policy.model.build_tiny_moe`), take one optimiser step on the same groups (rank 0 leading through
:class:`scalectl.rl.train.data_parallel.TrainerRanks`, rank 1 following), and rank 0 pushes its weights
to the generator over a weights group of two (the generator 0, the leader 1) with
:func:`scalectl.rl.transport.stream.push_weights` inside :meth:`TrainerRanks.gathered` (versions 1 and 2),
then the last word. The leader saves what it pushed (its state dict, gathered), the generator what
it loaded, to OUT.RANK.pt.
"""

from __future__ import annotations

import os
import sys

import torch


class Recorder:
    """A rollout engine's ``update_weights``, keeping a copy of each version."""

    def __init__(self):
        self.versions = {}

    def update_weights(self, state_dict, version):
        self.versions[version] = {k: v.clone() for k, v in state_dict.items()}


def main(rank: int, port: int, weights_port: int, out: str, kind: str = "tiny") -> None:
    torch.set_num_threads(1)
    from scalectl.rl.transport.broadcast import StatelessGroup
    from scalectl.rl.policy.model import build_tiny_model, build_tiny_moe
    from scalectl.rl.transport.stream import WeightSlot, end_weights, push_weights, weight_layout

    build = build_tiny_moe if kind == "moe" else build_tiny_model

    if rank == 2:
        group = StatelessGroup("127.0.0.1", weights_port, 0, 2, timeout_s=300)
        engine = Recorder()
        slot = WeightSlot(group, 1, engine, weight_layout(build(seed=5)))
        slot.drain()
        torch.save({"versions": engine.versions, "ended": slot.ended, "loads": slot.loads}, f"{out}.{rank}.pt")
        return

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    from dp_worker import make_groups
    import deepspeed

    initialize = deepspeed.initialize

    def partition_everything(*args, config, **kwargs):
        # DeepSpeed keeps parameters under stage3_param_persistence_threshold elements (1e5 by
        # default: every tiny-model tensor) whole on every rank; 0 partitions them all
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return initialize(*args, config=config, **kwargs)

    deepspeed.initialize = partition_everything
    from scalectl.recipe.schema import Loss, Optim
    from scalectl.rl.train.data_parallel import TrainerRanks, follow
    from scalectl.rl.train.trainer import PolicyTrainer

    group = StatelessGroup("127.0.0.1", weights_port, 1, 2, timeout_s=300) if rank == 0 else None
    pushed = {}
    for version, stage in ((1, 0), (2, 3)):
        trainer = PolicyTrainer(build(seed=0), loss=Loss(type="cispo", aggregation="prompt"),
                                optim=Optim(lr=1e-3, warmup_steps=0, weight_decay=0.0, grad_clip=None),
                                head_fp32=True, temperature=1.0, micro_batch_size=64, zero_stage=stage)
        if rank == 1:
            follow(trainer, "batch", pad_id=0)
            continue
        ranks = TrainerRanks(trainer, "batch", pad_id=0)
        ranks.step(make_groups(seed=0))
        partition = {k: (p.data.numel(), hasattr(p, "ds_id")) for k, p in trainer.model.named_parameters()}

        def send(model, version=version):
            pushed[version] = {k: v.clone() for k, v in model.state_dict().items()}
            return push_weights(group, model, version)

        stats = ranks.gathered(send)
        pushed[f"{version}/stats"] = (stats.bytes, stats.buckets)
        pushed[f"{version}/partition"] = partition
        if version == 2:
            ranks.gathered(lambda model: end_weights(group, weight_layout(model)))
        ranks.stop()
    if rank == 0:
        torch.save(pushed, f"{out}.{rank}.pt")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], *sys.argv[5:])
