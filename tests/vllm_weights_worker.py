"""One process of the vLLM weight-broadcast check (run by tests/test_vllm_broadcast.py).

``python tests/vllm_weights_worker.py RANK SIZE PORT CKPT OUT``: rank 0 (the
trainer) takes the tiny checkpoint's weights, changes them as a step would and
broadcasts them over a :class:`scalectl.rl.transport.broadcast.StatelessGroup` (gloo);
every other rank (a generator) holds a vLLM engine (CPU build) whose
``poll_weights`` is a :class:`scalectl.rl.transport.broadcast.WeightReceiver` feeding
``update_weights``, generates until the update has arrived, then generates
again and compares its log-probs with a teacher-forced pass of the received
weights. Each rank saves what it found to OUT.RANK.pt.
"""

from __future__ import annotations

import sys

import torch


def main(rank: int, size: int, port: int, ckpt: str, out: str) -> None:
    from scalectl.rl.transport.broadcast import StatelessGroup, WeightReceiver, broadcast_weights
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer
    from scalectl.rl.policy.logprobs import token_logprobs
    from scalectl.rl.rollout.sampling import SamplingParams

    torch.set_num_threads(1)
    model = build_tiny_model(seed=0)                      # the checkpoint's weights
    state = model.state_dict()
    if rank == 0:
        group = StatelessGroup("127.0.0.1", port, 0, size, timeout_s=900)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.9).add_(0.01)
        stats = broadcast_weights(list(state.values()), src=0, group=group)
        group.store.wait([f"done-{r}" for r in range(1, size)])   # the store lives in this process
        torch.save({"state": model.state_dict(), "bytes": stats.bytes}, f"{out}.0.pt")
        return
    from scalectl.rl.rollout.vllm import VLLMRolloutEngine

    engine = VLLMRolloutEngine(ckpt, build_tokenizer(), dtype="fp32", head_fp32=True, max_model_len=256, seed=0,
                               enforce_eager=True)
    names, tensors = list(state), [t.clone() for t in state.values()]
    group = StatelessGroup("127.0.0.1", port, rank, size, timeout_s=900)
    receiver = WeightReceiver(tensors, src=0, group=group,
                              on_update=lambda v: engine.update_weights(dict(zip(names, tensors)), v))
    engine.poll_weights = receiver.poll
    params = SamplingParams(max_new_tokens=30)
    versions = []
    while receiver.version < 1:
        versions += [c.versions for g in engine.generate(["12+34=", "1+1="], 2, params, seed=len(versions))
                     for c in g]
    engine.poll_weights = None           # the one update has landed; the next posted one never comes
    group.store.set(f"done-{rank}", "1")
    after = [c for g in engine.generate(["12+34=", "7-9+100="], 3, params, seed=99) for c in g]
    received = build_tiny_model(seed=0)
    received.load_state_dict(dict(zip(names, tensors)))
    diffs = []
    for c in after:
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            logp, _ = token_logprobs(received, ids, torch.ones_like(ids), head_fp32=True,
                                     start=len(c.prompt_ids) - 1, with_entropy=False)
        diffs += [abs(a - b) for a, b in zip(c.logprobs, logp[0].tolist())]
    torch.save({"state": dict(zip(names, tensors)), "versions": versions, "after_versions": [c.versions for c in after],
                "max_diff": max(diffs), "tokens": len(diffs)}, f"{out}.{rank}.pt")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
