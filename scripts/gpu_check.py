"""The GPU check: a DeepSpeed trainer step and the CPU engine's code path on one CUDA device.

Run by ``scripts/gpu-check.sh`` (under 8 minutes on one GPU). It checks, printing
each figure:

1. the environment: torch, CUDA, the device, bf16 support;
2. generation with :class:`scalectl.rl.rollout.cpu.CPURolloutEngine` on the GPU
   (model in bf16, LM head and log-softmax in fp32): tokens/s;
3. a :class:`scalectl.rl.train.trainer.PolicyTrainer` step (DeepSpeed, bf16, world size 1,
   NCCL): the backend in use and the median step time;
4. log-prob agreement: the generator's recorded log-probs against the trainer's
   teacher-forced ones on the same completions, for the bf16 model and for an fp32
   copy (fp32 must agree to 1e-3; bf16 is reported, with a loose bound), before and
   after a weight update from the trainer to the engine.

Without a GPU it runs the same code on the CPU in fp32 with gloo (``DEGRADED``
is printed): every code path but the CUDA kernels and NCCL is exercised.

The model is a Qwen2-architecture model built from a config (no download):
by default 8 layers of hidden 512 on a GPU (~30 M parameters), the tiny
model on a CPU.  Exit status 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _groups(completions_per_prompt, seed: int = 0) -> list:
    """Groups with alternating rewards, so every completion has a non-zero advantage."""
    from scalectl.rl.rollout.groups import Group

    groups = []
    for k, comps in enumerate(completions_per_prompt):
        rewards = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(comps))])
        groups.append(Group(k, comps, [bool(r > 0) for r in rewards], rewards))
    return groups


def logprob_gap(trainer, batch) -> tuple[float, float]:
    """(max, mean) |trainer log-prob - generator log-prob| over the trained tokens."""
    from scalectl.rl.policy.logprobs import token_logprobs

    batch = batch.to(trainer.engine.device)
    with torch.no_grad():
        logp, _ = token_logprobs(trainer.engine, batch.input_ids, batch.attention_mask,
                                 head_fp32=trainer.head_fp32, temperature=trainer.temperature, start=batch.start)
    on = batch.loss_mask.bool()
    diff = (logp.float() - batch.gen_logp.float()).abs()[on]
    return float(diff.max()), float(diff.mean())


def run(args) -> bool:
    from scalectl.recipe.schema import Loss, Optim
    from scalectl.rl.train.batch import build_train_batch
    from scalectl.rl.policy.model import DTYPES, build_tiny_model, build_tokenizer, pad_token_id
    from scalectl.rl.rollout.cpu import CPURolloutEngine
    from scalectl.rl.rollout.sampling import SamplingParams
    from scalectl.rl.train.trainer import PolicyTrainer

    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}")
    if cuda:
        torch.cuda.set_device(0)
        print(f"device: {torch.cuda.get_device_name(0)}, bf16 supported: {torch.cuda.is_bf16_supported()}")
        torch.backends.cuda.matmul.allow_tf32 = False      # fp32 means fp32 for the agreement check
    else:
        print("DEGRADED: no GPU (or --cpu): the same code runs on the CPU in fp32 with gloo")
        torch.set_num_threads(args.threads)
    dtype = "bf16" if cuda else "fp32"
    size = dict(hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                num_attention_heads=max(1, args.hidden // 64), num_key_value_heads=max(1, args.hidden // 64),
                max_position_embeddings=512) if cuda else {}
    tok = build_tokenizer()
    base = build_tiny_model(seed=0, **size)
    n_params = sum(p.numel() for p in base.parameters())
    print(f"model: Qwen2, {n_params / 1e6:.1f} M parameters, {dtype}, LM head fp32")
    ok = True

    # -- the trainer: DeepSpeed, world size 1 (NCCL on a GPU) --------------------------------
    model = copy.deepcopy(base).to(device=device, dtype=DTYPES[dtype])
    trainer = PolicyTrainer(model, loss=Loss(type="cispo", aggregation="prompt"),
                            optim=Optim(lr=1e-5, warmup_steps=0, eps=1e-8, weight_decay=0.0, grad_clip=1.0),
                            head_fp32=True, temperature=1.0, micro_batch_size=args.micro_batch,
                            zero_stage=0, dtype=dtype)
    import torch.distributed as dist

    backend = dist.get_backend() if dist.is_initialized() else "none"
    print(f"trainer: DeepSpeed world size {dist.get_world_size() if dist.is_initialized() else 1}, "
          f"backend {backend}, device {trainer.engine.device}")
    if cuda and backend != "nccl":
        print("FAIL: the trainer is not on NCCL")
        ok = False

    # -- generation with the CPU engine's code path on the device ----------------------------
    gen_model = copy.deepcopy(base).to(device=device, dtype=DTYPES[dtype])
    engine = CPURolloutEngine(gen_model, tok, head_fp32=True, max_batch=args.prompts * args.samples)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    prompts = [f"{(7 * i) % 90 + 10}+{(13 * i) % 90 + 10}=" for i in range(args.prompts)]
    engine.generate(prompts[:2], 2, params, seed=1)                   # warm-up (kernels, allocator)
    _sync(device)
    t = time.perf_counter()
    out = engine.generate(prompts, args.samples, params, seed=0)
    _sync(device)
    seconds = time.perf_counter() - t
    tokens = sum(len(c.token_ids) for g in out for c in g)
    print(f"generation: {len(prompts)} prompts x {args.samples} samples, {tokens} tokens in {seconds:.2f} s: "
          f"{tokens / seconds:,.0f} tokens/s")

    # -- log-prob agreement, then the trainer's steps -----------------------------------------
    batch = build_train_batch(_groups(out), "batch", pad_token_id(tok))
    mx, mean = logprob_gap(trainer, batch)
    bound = 0.5 if dtype == "bf16" else 1e-3
    print(f"log-prob agreement ({dtype} weights, fp32 head), generator vs trainer: max {mx:.2e}, mean {mean:.2e} "
          f"(bound on max {bound:g})")
    ok &= mx < bound
    if cuda:        # the same check in fp32, where only summation order differs
        fp32_trainer_model = copy.deepcopy(base).to(device)
        fp32_engine = CPURolloutEngine(copy.deepcopy(base).to(device), tok, head_fp32=True)
        out32 = fp32_engine.generate(prompts[:16], 4, params, seed=0)
        b32 = build_train_batch(_groups(out32), "batch", pad_token_id(tok)).to(device)
        from scalectl.rl.policy.logprobs import token_logprobs

        with torch.no_grad():
            lp, _ = token_logprobs(fp32_trainer_model, b32.input_ids, b32.attention_mask, head_fp32=True,
                                   temperature=1.0, start=b32.start)
        gap32 = float((lp - b32.gen_logp).abs()[b32.loss_mask.bool()].max())
        print(f"log-prob agreement (fp32 weights): max {gap32:.2e} (bound 1e-3)")
        ok &= gap32 < 1e-3
    times = []
    for _ in range(args.steps):
        _sync(device)
        t = time.perf_counter()
        metrics = trainer.train_step(batch)
        _sync(device)
        times.append(time.perf_counter() - t)
    trained = batch.n_tokens
    step = statistics.median(times)
    print(f"trainer step: {batch.input_ids.shape[0]} completions, {trained} trained tokens, median of "
          f"{args.steps}: {step:.3f} s ({trained / step:,.0f} trained tokens/s), loss {metrics['loss']:.4f}, "
          f"grad_norm {metrics.get('grad_norm')}")
    ok &= all(torch.isfinite(p).all() for p in trainer.model.parameters())

    # -- a weight update from the trainer to the engine, then agreement again ------------------
    engine.update_weights({k: v.to(device) for k, v in trainer.state_dict().items()}, version=args.steps)
    out2 = engine.generate(prompts, args.samples, params, seed=2)
    batch2 = build_train_batch(_groups(out2), "batch", pad_token_id(tok))
    mx2, mean2 = logprob_gap(trainer, batch2)
    print(f"after the weight update: max {mx2:.2e}, mean {mean2:.2e} (bound on max {bound:g})")
    ok &= mx2 < bound
    print("gpu check: " + ("PASS" if ok else "FAIL") + ("" if cuda else " (DEGRADED: CPU)"))
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is present")
    ap.add_argument("--hidden", type=int, default=512, help="hidden size of the GPU model")
    ap.add_argument("--layers", type=int, default=8, help="layers of the GPU model")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="torch threads in CPU mode")
    args = ap.parse_args(argv)
    if args.cpu or not torch.cuda.is_available():     # a smaller workload for the CPU's degraded mode
        for key, value, default in (("prompts", 16, 64), ("samples", 4, 8), ("new_tokens", 24, 64), ("steps", 2, 5)):
            if getattr(args, key) == default:
                setattr(args, key, value)
    return 0 if run(args) else 1


if __name__ == "__main__":
    sys.exit(main())
