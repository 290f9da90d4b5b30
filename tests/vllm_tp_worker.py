"""One process of the tensor-parallel weight-broadcast check (run by tests/test_vllm_broadcast.py).

``python tests/vllm_tp_worker.py ROLE PORT CKPT OUT TP [MODEL]`` (MODEL: ``tiny``, the default, or
``moe``, :func:`scalectl.rl.policy.model.build_tiny_moe`): ``trainer`` hosts the job's rendezvous
store at PORT, takes the checkpoint's weights, changes them as a step would and pushes them
(:func:`scalectl.rl.transport.stream.push_weights`, version 1) to the weights' group of the
generator's TP workers and itself (group ranks 0 .. TP-1 and TP), then the last word (version
-1); ``generator`` holds a vLLM engine (CPU build) at tensor-parallel size TP whose workers take
their seats in that group (:class:`scalectl.rl.transport.vllm_worker.WorkerWeightSlot`), samples
until version 1 has landed, then samples again and compares its log-probs with a teacher-forced
pass of the weights the trainer pushed.  Each saves what it found to OUT.ROLE.pt.
"""

from __future__ import annotations

import sys

import torch


def build(kind: str):
    from scalectl.rl.policy.model import build_tiny_model, build_tiny_moe

    return build_tiny_moe(seed=0) if kind == "moe" else build_tiny_model(seed=0)


def changed(kind: str):
    """The checkpoint's weights changed as a step would (every tensor scaled and shifted)."""
    model = build(kind)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.9).add_(0.01)
    return model


def trainer(port: int, out: str, tp: int, kind: str) -> None:
    import torch.distributed as dist

    from scalectl.rl.transport.broadcast import StatelessGroup
    from scalectl.rl.transport.stream import end_weights, push_weights, weight_layout

    store = dist.TCPStore("127.0.0.1", port, 2, True, timeout=__import__("datetime").timedelta(seconds=900))
    model = changed(kind)
    group = StatelessGroup("", 0, tp, tp + 1, timeout_s=900, store=dist.PrefixStore("scalectl/weights", store))
    stats = push_weights(group, model, 1)
    store.wait(["sampled"])                               # the generator has sampled with version 1
    end_weights(group, weight_layout(model))
    store.wait(["done"])
    torch.save({"state": model.state_dict(), "bytes": stats.bytes}, f"{out}.trainer.pt")


def generator(port: int, ckpt: str, out: str, tp: int, kind: str) -> None:
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from scalectl.rl.policy.logprobs import token_logprobs
    from scalectl.rl.policy.model import build_tokenizer
    from scalectl.rl.rollout.sampling import SamplingParams
    from scalectl.rl.rollout.vllm import VLLMRolloutEngine
    from scalectl.rl.transport.stream import Seats, weight_layout
    from scalectl.rl.transport.vllm_worker import WorkerWeightSlot

    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=900))
    started = time.perf_counter()
    engine = VLLMRolloutEngine(ckpt, build_tokenizer(), dtype="fp32", head_fp32=True, max_model_len=256, seed=0,
                               enforce_eager=True, tensor_parallel_size=tp)
    init_s = time.perf_counter() - started
    layout = weight_layout(build(kind))
    slot = WorkerWeightSlot.join(engine, ("127.0.0.1", port), Seats("weights", 0, tp, tp + 1), layout)
    engine.poll_weights = slot.poll
    params = SamplingParams(max_new_tokens=30)
    versions = []
    while slot.loads < 1:
        versions += [c.versions for g in engine.generate(["12+34=", "1+1="], 2, params, seed=len(versions))
                     for c in g]
    after = [c for g in engine.generate(["12+34=", "7-9+100="], 3, params, seed=99) for c in g]
    store.set("sampled", "1")
    slot.drain()                                          # the trainer's last word
    received, original = changed(kind), build(kind)
    diffs, before = [], []
    for c in after:
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        for model, found in ((received, diffs), (original, before)):
            with torch.no_grad():
                logp, _ = token_logprobs(model, ids, torch.ones_like(ids), head_fp32=True,
                                         start=len(c.prompt_ids) - 1, with_entropy=False)
            found += [abs(a - b) for a, b in zip(c.logprobs, logp[0].tolist())]
    ranks = engine.collective_rpc("scalectl_worker_rank")
    torch.save({"versions": versions, "after_versions": [c.versions for c in after], "max_diff": max(diffs),
                "max_diff_original": max(before), "tokens": len(diffs), "ended": slot.ended, "loads": slot.loads, "ranks": ranks,
                "bytes": slot.stats.bytes, "tp": engine.settings["tensor_parallel_size"], "init_s": init_s},
               f"{out}.generator.pt")
    store.set("done", "1")


if __name__ == "__main__":
    role, port, ckpt, out, tp = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    kind = sys.argv[6] if len(sys.argv) > 6 else "tiny"
    if role == "trainer":
        trainer(port, out, tp, kind)
    else:
        generator(port, ckpt, out, tp, kind)
