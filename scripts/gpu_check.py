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
   after a weight update from the trainer to the engine;
5. held-out evaluation as the generators sample it for the trainer
   (:mod:`scalectl.rl.evaluation.shares`): every completion from the version the point
   names, the point equal to ``evaluate`` on the same engine;
6. a tiny mixture of experts (Qwen2-MoE) through one DeepSpeed ZeRO-3 step, its experts
   gathered and pushed to the CPU engine's code path, which samples with them; the
   trainer's memory estimate of the dry run against ``torch.cuda.max_memory_allocated``
   (reported, not a pass condition).

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


def check_evaluation(engine, version: int, args) -> bool:
    """Held-out evaluation as the generators sample it for the trainer
    (:mod:`scalectl.rl.evaluation.shares`): the engine, holding the weights of ``version``, samples
    every chunk of a point (one evaluating generator), :class:`~scalectl.rl.evaluation.shares.PointParts`
    checks every completion was sampled by ``version`` alone, and the point equals
    :func:`~scalectl.rl.evaluation.pass_rate.evaluate` on the same engine and seed."""
    from scalectl.rl.data.arithmetic import eval_problems
    from scalectl.rl.evaluation.pass_rate import evaluate
    from scalectl.rl.evaluation.shares import PointParts, assign_chunks, evaluate_share
    from scalectl.rl.reward.scoring import Scorer
    from scalectl.rl.rollout.sampling import SamplingParams

    problems = eval_problems(args.eval_prompts, seed=1, difficulty=2)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, top_p=1.0)
    share = assign_chunks(len(problems), [0])
    parts = PointParts(version, {0: len(share[0])})
    score = Scorer()                                       # the built-in math checker
    parts.add(0, evaluate_share(engine, problems, share[0], params, samples_per_prompt=args.eval_k, seed=7,
                                score=score))
    point = parts.result(args.eval_k)
    direct = evaluate(engine, problems, params, samples_per_prompt=args.eval_k, seed=7, score=score)
    same = point["correct_counts"] == direct["correct_counts"] and point["mean_length"] == direct["mean_length"]
    completions = sum(len(r["versions"]) for r in parts.record())
    print(f"evaluation for the trainer (version {version}): {len(problems)} prompts x {args.eval_k}, "
          f"{completions} completions all of version {version}, pass rate {point['pass_rate']:.4f}, "
          f"mean length {point['mean_length']:.1f}; equal to evaluate() on the same engine: {same}")
    return same and completions == len(problems) * args.eval_k


def check_moe_zero3(device, dtype: str, args) -> bool:
    """A tiny mixture of experts (:func:`~scalectl.rl.policy.model.build_tiny_moe`) through one
    DeepSpeed ZeRO-3 step (world size 1), its experts gathered for a push into the CPU engine's
    code path, which then samples with them; the trainer's peak memory against the dry run's
    estimate (ZeRO states, :func:`scalectl.job.layout.trainer_memory`, plus one micro-batch's
    activations and LM head, :func:`scalectl.job.memory.activation_bytes`, :func:`~scalectl.job.memory.head_bytes`);
    on a GPU ``torch.cuda.max_memory_allocated``, on the CPU not measured."""
    from scalectl.job.layout import trainer_memory
    from scalectl.job.memory import activation_bytes, head_bytes
    from scalectl.recipe.schema import Loss, Optim
    from scalectl.rl.policy.model import DTYPES, build_tiny_moe, build_tokenizer, checkpoint_state, pad_token_id
    from scalectl.rl.rollout.cpu import CPURolloutEngine
    from scalectl.rl.rollout.sampling import SamplingParams
    from scalectl.rl.train.batch import build_train_batch
    from scalectl.rl.train.trainer import PolicyTrainer

    tok = build_tokenizer()
    base = build_tiny_moe(seed=0)
    n_params = sum(p.numel() for p in base.parameters())
    engine = CPURolloutEngine(copy.deepcopy(base).to(device=device, dtype=DTYPES[dtype]), tok, head_fp32=True)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    prompts = [f"{(7 * i) % 90 + 10}+{(13 * i) % 90 + 10}=" for i in range(args.prompts)]
    batch = build_train_batch(_groups(engine.generate(prompts, args.samples, params, seed=3)), "batch",
                              pad_token_id(tok))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    trainer = PolicyTrainer(copy.deepcopy(base).to(device=device, dtype=DTYPES[dtype]),
                            loss=Loss(type="cispo", aggregation="prompt"),
                            optim=Optim(lr=1e-4, warmup_steps=0, eps=1e-8, weight_decay=0.0, grad_clip=1.0),
                            head_fp32=True, temperature=1.0, micro_batch_size=args.micro_batch, zero_stage=3,
                            dtype=dtype)
    metrics = trainer.train_step(batch)
    ok = bool(torch.isfinite(torch.tensor(metrics["loss"])))
    pushed = trainer.gathered(lambda m: {k: v.detach().clone() for k, v in m.state_dict().items()})
    names = checkpoint_state(base, pushed)
    experts = sum(".experts." in k for k in names)
    moved = max(float((pushed[k].float().cpu() - v.float()).abs().max()) for k, v in base.state_dict().items())
    print(f"MoE trainer (ZeRO-3, {dtype}, {n_params / 1e6:.2f} M parameters, "
          f"{base.config.num_experts} experts): loss {metrics['loss']:.4f}, pushed {len(pushed)} tensors "
          f"({experts} per-expert checkpoint tensors), largest change {moved:.2e}")
    ok &= moved > 0 and experts > 0
    engine.update_weights({k: v.to(device) for k, v in pushed.items()}, version=1)
    out = engine.generate(prompts[:4], 2, params, seed=4)
    versions = {v for g in out for c in g for v in c.versions}
    print(f"MoE generation after the push: {sum(len(c.token_ids) for g in out for c in g)} tokens, "
          f"versions {sorted(versions)}")
    ok &= versions <= {1}
    longest = int(batch.input_ids.shape[1])
    mb = min(args.micro_batch, int(batch.input_ids.shape[0]))
    states = trainer_memory(n_params, 3, 1, dtype).total
    acts = activation_bytes(micro_batch=mb, seq_len=longest, hidden=base.config.hidden_size,
                            layers=base.config.num_hidden_layers, checkpointing=False,
                            dtype_bytes=2 if dtype == "bf16" else 4)
    head = head_bytes(mb, longest, base.config.vocab_size)
    estimate = states + acts + head
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - before
        print(f"MoE trainer memory: estimate {estimate / 1e6:,.1f} MB (ZeRO states {states / 1e6:,.1f} + "
              f"activations {acts / 1e6:,.1f} + LM head {head / 1e6:,.1f}), measured peak {peak / 1e6:,.1f} MB "
              f"(torch.cuda.max_memory_allocated), ratio {peak / estimate:.2f} (reported, not a pass condition)")
    else:
        print(f"MoE trainer memory: estimate {estimate / 1e6:,.1f} MB (ZeRO states {states / 1e6:,.1f} + "
              f"activations {acts / 1e6:,.1f} + LM head {head / 1e6:,.1f}); not measured on the CPU")
    return ok


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
    ok &= check_evaluation(engine, args.steps, args)
    ok &= check_moe_zero3(device, dtype, args)
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
    ap.add_argument("--eval-prompts", type=int, default=128, help="held-out prompts of the evaluation check")
    ap.add_argument("--eval-k", type=int, default=4, help="samples per held-out prompt")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in CPU mode")
    args = ap.parse_args(argv)
    if args.cpu or not torch.cuda.is_available():     # a smaller workload for the CPU's degraded mode
        for key, value, default in (("prompts", 16, 64), ("samples", 4, 8), ("new_tokens", 24, 64), ("steps", 2, 5),
                                     ("eval_prompts", 16, 128)):
            if getattr(args, key) == default:
                setattr(args, key, value)
    return 0 if run(args) else 1


if __name__ == "__main__":
    sys.exit(main())
