"""RL step throughput of scalectl against TRL's ``GRPOTrainer`` on the same tiny model and task,
at equal explicit thread counts and at each side's best, against this machine's FLOP limit.

Both sides train the tiny setup's warm start (``recipes/minimax.toml`` +
``setups/tiny-cpu.toml``) on the same synthetic arithmetic prompts (the setup's
difficulty), 16 prompts x 8 generations per step, at most ``length.max_new_tokens``
new tokens, temperature 1, the same learning rate, Adam betas and epsilon, no
weight decay, gradient clipping at ``optim.grad_clip``, a constant learning rate
(no warm-up), no KL term, one optimisation pass per batch, FP32, on the CPU, for
``--steps`` optimiser steps (default 40); the reward is +1/-1 from
:func:`scalectl.rl.reward.checker.check` on both sides.

Losses (token-level aggregation on both sides, as TRL aggregates):

* ``cispo``: CISPO with eps_max 5 (scalectl ``loss.type = "cispo"``,
  ``clip_high = 5``; TRL ``loss_type = "cispo"``, ``epsilon_high = 5``);
* ``clip``: DAPO's asymmetric PPO clip 0.2 / 0.28 (scalectl ``ppo_clip``;
  TRL ``loss_type = "dapo"``, ``epsilon = 0.2``, ``epsilon_high = 0.28``).

Cases.  For every thread count of ``--threads`` (default 1 and 2), both sides
run with exactly that many torch threads (``OMP_NUM_THREADS`` and
``torch.set_num_threads`` in the worker; scalectl also ``hardware.threads``):
scalectl ``sync`` against TRL with one generation per step, for every loss,
and scalectl ``sync`` with its decoding step compiled (``hardware.compile = true``)
beside the default eager one on the same work (``--no-compiled``: without);
for the first loss also scalectl ``ppo_off_policy`` (k = ``--k``, the
single-process loop, :func:`scalectl.rl.run.run_training`) against TRL with
``steps_per_generation = k``.  ``pipeline`` (k) runs once per round with
its processes sharing the machine's cores (one thread each on 2 cores) and is
compared with ``sync`` at ``nproc`` threads (the same cores).  "Each side's
best" is the thread count with the higher median rate, chosen per side.

Steady state.  Each worker records, for every optimiser step, the seconds since
its training began and the completions and FLOPs done so far (scalectl: the
run's ``steps.jsonl`` and compute meter, which leave out evaluation; TRL: its
``on_step_end`` callback and the completions its reward function saw).  The
rate is taken over steps ``--warmup``+1 .. ``--steps`` (default: the first 8
excluded, whole cycles of k = 8 for the off-policy modes), the same way on both
sides, so start-up, first-call and model-loading costs are left out.  scalectl
runs as a user's run does (``hardware.compile = false``, the default: eager
decoding); the compiled case pays the trace and, without a cached build, the C++
build of its decoding step in its first step, inside the warm-up (that cost is
printed: the seconds of its first step), and every later compile (a recompile) is
counted and printed with the graph breaks (``torch._dynamo`` counters).

Load.  The runs of a round alternate between the sides (the order reversed in
every other round), each a fresh process, and the 1-minute load average is recorded
before and after each run, with the share of CPU time the hypervisor took from this
machine during it (steal, ``/proc/stat``), which the load average does not show.
A ratio is printed only when every run it uses stayed under ``--max-load``
(default nproc + 0.5); otherwise it says ``load too high, rerun``.

FLOP limit.  In the same invocation (once per round, fresh process per thread
count) the fp32 matmul rate of this machine is measured (``--peak-size``
square matrices, best of repeats): the physical limit.  A step's useful FLOPs
are the project's count (:mod:`scalectl.rl.accounting`: 2N per token
generated or prefilled, 6N per token trained, N parameters), applied to the
same tokens on both sides: training is counted only for groups whose rewards
differ (a group of equal rewards has advantage 0 and no gradient; scalectl
skips it, TRL computes it, and neither side is credited with it); each rate is
printed as a fraction of the limit at its thread count.  The mean completion length of each run is printed, so equal
work on both sides can be checked, and for scalectl the share of groups whose
rewards are all equal (advantage 0: its trainer skips them, TRL computes them).
Targets: scalectl >= 2x TRL at each side's best, and >= 50 % of the FLOP limit.
Peak memory of the process tree (psutil, every 50 ms) is shown for scale.

    python benchmarks/bench_trl.py [--steps 40] [--warmup 8] [--rounds 2] [--threads 1 2]
    python benchmarks/bench_trl.py --quick        # cispo sync only, one round (eager, compiled, TRL)
    python benchmarks/bench_trl.py --profile OUT_DIR   # pyinstrument profile of one run per side
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import (ROOT, CpuSteal, Figure, default_max_load, loadavg1, machine_line, median, peak_rss_mib,
                    print_table, report)

RECIPE = ROOT / "recipes" / "minimax.toml"
SETUP = ROOT / "setups" / "tiny-cpu.toml"
TARGET_RATIO = 2.0
TARGET_FLOP_FRACTION = 0.50
LOSSES = {  # scalectl overrides, TRL GRPOConfig fields
    "cispo": (["loss.type=cispo", "loss.clip_high=5.0", "loss.aggregation=token"],
              {"loss_type": "cispo", "epsilon_high": 5.0}),
    "clip": (["loss.type=ppo_clip", "loss.clip_low=0.2", "loss.clip_high=0.28", "loss.aggregation=token"],
             {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28}),
}


# -- memory ----------------------------------------------------------------------------------------


class TreeMemory:
    """Peak resident memory (MiB) of this process and all its descendants, sampled in a thread."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak, self._stop = interval, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> float:
        import psutil

        me = psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total / 2**20

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


# -- the two sides (run inside a worker process) -----------------------------------------------------


def load_recipe(loss: str, mode: str, k: int, steps: int, model: str | None = None, threads: int | None = None,
                compile_step: bool = False):
    """The benchmark's recipe: minimax + tiny-cpu, the loss variant, the mode, no filters, no warm-up;
    ``model``: a checkpoint folder instead of the setup's (warm-started) model; ``threads``: torch threads;
    ``compile_step``: ``hardware.compile`` (the decoding step compiled; its trace and build fall in
    the first, warm-up, steps)."""
    from scalectl.recipe.load import load

    overrides = ([f"model.path={model}"] if model else []) + LOSSES[loss][0] + [
        f"async.mode={mode}", f"async.k={k}", f"budget.steps={steps}", "optim.warmup_steps=0",
        "optim.weight_decay=0.0", "filter.zero_variance=false", "filter.retire_solved=false",
        "filter.dynamic_sampling=false", "length.control=none", "advantage.normalization=prompt",
        "precision.lm_head=fp32", "batch.prompts_per_step=16", "batch.generations_per_prompt=8",
        f"eval.every_steps={steps}", "eval.prompts=16", "eval.samples_per_prompt=1",
        f"checkpoint.every_steps={steps + 1}", f"hardware.compile={str(compile_step).lower()}"] \
        + ([f"hardware.threads={threads}"] if threads else [])
    return load(RECIPE, SETUP, overrides)


def run_scalectl(loss: str, mode: str, k: int, steps: int, model: str | None, threads: int | None,
                 compile_step: bool = False) -> dict:
    """One scalectl training run; per step: seconds of training so far, completions and FLOPs so far;
    with ``compile_step``, the graphs inductor compiled, the recompiles and the graph breaks."""
    from scalectl.job.body import StoreSink
    from scalectl.rl.data.splits import load_prompt_sets
    from scalectl.rl.loop import Reporter
    from scalectl.rl.run import run_training
    from scalectl.rl.schedule.modes import schedule_for
    from scalectl.rl.train.warmstart import ensure_warm_start
    from scalectl.store.database import Store

    recipe = load_recipe(loss, mode, k, steps, model, threads, compile_step)
    ensure_warm_start(recipe)   # built once and cached; run_training loads it
    train, held_out = load_prompt_sets(recipe)
    per_step = recipe.batch.prompts_per_step * recipe.batch.generations_per_prompt
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "bench.db")
        run_id = store.create_run("bench", recipe=recipe.to_dict(), recipe_hash=recipe.content_hash,
                                  seed=recipe.seed, run_dir=tmp)
        run_training(recipe, Path(tmp), schedule=schedule_for(recipe.async_),
                     sink=StoreSink(str(Path(tmp) / "bench.db"), run_id), train_problems=train,
                     eval_problems=held_out, reporter=Reporter())
        store.close()
        rows = [json.loads(line) for line in (Path(tmp) / "steps.jsonl").read_text().splitlines()]
    devices = recipe.hardware.devices   # gpu_hours = devices x metered seconds
    return {"t": [r["gpu_hours"] * 3600.0 / devices for r in rows], "completions": [r["step"] * per_step for r in rows],
            "flops": [r["flops"] for r in rows], "threads": _torch_threads(),
            "mean_length": sum(r["mean_length"] for r in rows) / len(rows),
            # groups whose rewards are all equal: advantage 0, skipped by scalectl's trainer, computed by TRL's
            "zero_variance_share": sum(r.get("zero_variance_share", 0.0) for r in rows) / len(rows),
            **(_compile_counts() if compile_step else {})}


def _compile_counts() -> dict:
    """What ``torch._dynamo`` compiled in this process: graphs, recompiles (graphs compiled
    after the first, each a guard that failed on a new shape or value), graph breaks."""
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"].get("unique_graphs", 0))
    return {"graphs": graphs, "recompiles": max(graphs - 1, 0),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def run_trl(loss: str, mode: str, k: int, steps: int, model: str | None, threads: int | None) -> dict:
    """One TRL GRPOTrainer run (CPU, transformers generate); per step: seconds since training began,
    completions and FLOPs (the project's count on the same tokens) so far."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from scalectl.rl.data.splits import load_prompt_sets
    from scalectl.rl.policy.model import load_policy
    from scalectl.rl.policy.model import n_params as count_params
    from scalectl.rl.reward.checker import check
    from scalectl.rl.train.warmstart import ensure_warm_start

    if threads:
        torch.set_num_threads(threads)
    recipe = load_recipe(loss, "sync", k, steps, model)
    model, tokenizer = load_policy(ensure_warm_start(recipe), recipe.model.dtype)
    n_params = count_params(model)   # N of the project's FLOP count, as scalectl's meter uses it
    train, _ = load_prompt_sets(recipe)
    P, G = recipe.batch.prompts_per_step, recipe.batch.generations_per_prompt
    # BOS then the prompt, as scalectl's encode_prompt (Qwen2's tokenizer adds no BOS itself)
    data = Dataset.from_list([{"prompt": tokenizer.bos_token + p.prompt, "answer": p.answer}
                              for p in train[:P * steps]])
    counted = {"completions": 0, "flops": 0.0, "tokens": 0}

    def reward(prompts, completions, completion_ids, answer, **_):
        rewards = [1.0 if check(c, a) else -1.0 for c, a in zip(completions, answer)]
        lengths = [len(tokenizer(p, add_special_tokens=False).input_ids) + len(ids)
                   for p, ids in zip(prompts, completion_ids)]
        counted["completions"] += len(completions)
        counted["tokens"] += sum(len(ids) for ids in completion_ids)
        # useful FLOPs, counted as scalectl's meter counts them: 2N per token prefilled or
        # generated, 6N per token trained only in groups whose rewards differ (GRPOTrainer
        # repeats each prompt G times in a row; a group of equal rewards has advantage 0 and
        # no gradient, so its training pass is not useful work on either side)
        counted["flops"] += 2.0 * n_params * sum(lengths)
        for i in range(0, len(rewards), G):
            if len(set(rewards[i:i + G])) > 1:
                counted["flops"] += 6.0 * n_params * sum(lengths[i:i + G])
        return rewards

    marks = {"t0": None, "t": [], "completions": [], "flops": []}

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **kw):
            marks["t0"] = time.perf_counter()

        def on_step_end(self, *a, **kw):
            marks["t"].append(time.perf_counter() - marks["t0"])
            marks["completions"].append(counted["completions"])
            marks["flops"].append(counted["flops"])

    o = recipe.optim
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
            per_device_train_batch_size=P * G, gradient_accumulation_steps=1, num_generations=G,
            steps_per_generation=k if mode == "off_policy" else 1, num_iterations=1,
            max_completion_length=recipe.length.max_new_tokens, temperature=recipe.sampling.temperature,
            top_p=1.0, top_k=0, learning_rate=o.lr, adam_beta1=o.beta1, adam_beta2=o.beta2,
            adam_epsilon=o.eps, weight_decay=0.0, max_grad_norm=o.grad_clip or 0.0,
            lr_scheduler_type="constant", warmup_steps=0, beta=0.0, scale_rewards="group",
            max_steps=steps, remove_unused_columns=False, report_to="none", save_strategy="no",
            logging_steps=10**6, disable_tqdm=True, seed=recipe.seed, dataloader_num_workers=0,
            **LOSSES[loss][1])
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                              processing_class=tokenizer, callbacks=[Clock()])
        trainer.train()
    return {"t": marks["t"], "completions": marks["completions"], "flops": marks["flops"],
            "threads": torch.get_num_threads(), "mean_length": counted["tokens"] / max(counted["completions"], 1)}


def matmul_peak(size: int, seconds: float = 1.0, repeats: int = 3) -> float:
    """fp32 matmul GFLOP/s of this process (torch's threads): best of ``repeats`` timed windows of
    about ``seconds`` each, after one warm-up product; 2 size^3 FLOPs per product."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = 0.0
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.mm(a, b)
            n += 1
        best = max(best, 2.0 * size**3 * n / (time.perf_counter() - t0) / 1e9)
    return best


def worker(side: str, loss: str, mode: str, k: int, steps: int, model: str | None, threads: int | None,
           profile: str | None) -> dict:
    """Run one side in this process and return its per-step record (with peak memory)."""
    import warnings

    warnings.filterwarnings("ignore")
    import functools

    fn = (run_trl if side == "trl" else functools.partial(run_scalectl, compile_step=side == "compiled"))
    profiler = None
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.005)
        profiler.start()
    with TreeMemory() as mem:
        out = fn(loss, mode, k, steps, model, threads)
    if profiler:
        profiler.stop()
        Path(profile).write_text(profiler.output_text(show_all=False, color=False) + "\n\nself time by function:\n"
                                 + profiler.output_text(flat=True, color=False))
        profiler.last_session.save(str(Path(profile).with_suffix(".pyisession")))
    out.update(peak_tree_mib=mem.peak, peak_self_mib=peak_rss_mib())
    return out


# -- the driver ----------------------------------------------------------------------------------


def steady(rec: dict, warmup: int) -> dict:
    """Completions/s and FLOP/s over steps ``warmup``+1 .. last of one run's per-step record.

    Raises:
        SystemExit: the run recorded no more steps than ``warmup``.
    """
    t, c, f = rec["t"], rec["completions"], rec["flops"]
    if len(t) <= warmup:
        raise SystemExit(f"a run recorded {len(t)} steps, not more than --warmup {warmup}")
    t0, c0, f0 = (0.0, 0, 0.0) if warmup == 0 else (t[warmup - 1], c[warmup - 1], f[warmup - 1])
    dt = t[-1] - t0
    return {"cps": (c[-1] - c0) / dt, "flops_per_s": (f[-1] - f0) / dt, "seconds": dt, "steps": len(t) - warmup}


def cases(args) -> list[tuple[str, str, str, int | None]]:
    """(side, loss, mode, threads) of one round, scalectl and TRL alternating; threads None:
    the processes share the cores (pipeline)."""
    out = []
    for loss in args.losses:
        for threads in args.threads:
            out += [("scalectl", loss, "sync", threads), ("trl", loss, "sync", threads)]
            if loss == args.losses[0] and args.compiled:
                out.append(("compiled", loss, "sync", threads))
            if loss == args.losses[0] and args.off_policy:
                out += [("scalectl", loss, "ppo_off_policy", threads), ("trl", loss, "off_policy", threads)]
        if loss == args.losses[0] and args.pipeline:
            out.append(("scalectl", loss, "pipeline", None))
    return out


def spawn(side: str, loss: str, mode: str, threads: int | None, args, profile: str | None = None) -> dict:
    """Run one case in a fresh process (``OMP_NUM_THREADS`` = threads, or unset to share the
    cores); its JSON result with the load average before and after."""
    cmd = [sys.executable, __file__, "--worker", side, "--loss", loss, "--mode", mode, "--k", str(args.k),
           "--steps", str(args.steps)] + (["--model", args.model] if args.model else []) \
        + (["--worker-threads", str(threads)] if threads else []) + (["--profile-out", profile] if profile else [])
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["TOKENIZERS_PARALLELISM"] = "false"
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    before, steal = loadavg1(), CpuSteal()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = loadavg1()
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{side} {loss} {mode} failed (exit {proc.returncode})")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["load"], out["steal"] = (before, after), steal.share()
    return out


def spawn_peak(threads: int, size: int) -> tuple[float, tuple[float, float]]:
    """(GFLOP/s, load before/after) of :func:`matmul_peak` in a fresh process with ``threads`` threads."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import torch; "
            f"torch.set_num_threads({threads}); from bench_trl import matmul_peak; print(matmul_peak({size}))")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    before = loadavg1()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return float(out.stdout.strip().splitlines()[-1]), (before, loadavg1())


def label(side: str, mode: str, k: int, threads: int | None) -> str:
    """A case's name in the figures."""
    t = "cores shared" if threads is None else f"{threads} thread{'s' if threads > 1 else ''}"
    if side in ("scalectl", "compiled"):
        name = {"sync": "scalectl sync", "ppo_off_policy": f"scalectl ppo_off_policy-{k}",
                "pipeline": f"scalectl pipeline-{k}"}[mode] + (" compiled" if side == "compiled" else "")
    else:
        name = "TRL GRPOTrainer" + ("" if mode == "sync" else f" steps_per_generation={k}")
    return f"{name}, {t}"


def short_label(side: str, mode: str, k: int, threads: int | None) -> str:
    """A case's name in the table (at most 19 characters, so the table fits 80 columns)."""
    t = "shared" if threads is None else f"{threads}t"
    who = {"scalectl": "scalectl", "compiled": "sc-compiled", "trl": "TRL"}[side]
    how = {"sync": "sync", "ppo_off_policy": f"off-{k}", "off_policy": f"off-{k}", "pipeline": f"pipe-{k}"}[mode]
    return f"{who} {how} {t}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="optimiser steps per run (a multiple of --k)")
    ap.add_argument("--warmup", type=int, default=8, help="first steps left out of every rate, on both sides")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="explicit thread counts, both sides")
    ap.add_argument("--losses", nargs="+", default=["cispo", "clip"], choices=list(LOSSES))
    ap.add_argument("--no-off-policy", dest="off_policy", action="store_false")
    ap.add_argument("--no-pipeline", dest="pipeline", action="store_false")
    ap.add_argument("--quick", action="store_true", help="cispo sync only, one round")
    ap.add_argument("--max-load", type=float, default=default_max_load(),
                    help="1-minute load average above which no ratio is given (default nproc + 0.5)")
    ap.add_argument("--peak-size", type=int, default=1024, help="matrix size of the matmul peak")
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the setup's model, warm-started)")
    ap.add_argument("--profile", default=None, help="write pyinstrument profiles of one sync run per side here")
    ap.add_argument("--no-compiled", dest="compiled", action="store_false",
                    help="leave out scalectl sync with its decoding step compiled (hardware.compile = true)")
    ap.add_argument("--worker", choices=["scalectl", "compiled", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--worker-threads", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--loss", default="cispo", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="sync", help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.loss, args.mode, args.k, args.steps, args.model,
                                args.worker_threads, args.profile_out)))
        return
    if args.quick:
        args.losses, args.off_policy, args.pipeline, args.rounds = ["cispo"], False, False, 1
    if args.steps % args.k or args.warmup % args.k or args.warmup >= args.steps:
        ap.error(f"--steps {args.steps} and --warmup {args.warmup} must be multiples of --k {args.k}, "
                 "warm-up below steps (whole off-policy cycles on both sides)")
    print(machine_line())
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        for side in ("scalectl", "trl"):
            spawn(side, args.losses[0], "sync", args.threads[0], args, str(Path(args.profile) / f"{side}.txt"))
        print(f"profiles written to {args.profile}/scalectl.txt and trl.txt")
        return
    nproc = os.cpu_count() or 1
    peak_threads = sorted(set(args.threads) | {nproc})
    peaks: dict[int, list[tuple[float, tuple]]] = {t: [] for t in peak_threads}
    results: dict[tuple, list[dict]] = {}
    for r in range(args.rounds):
        for t in peak_threads:
            peaks[t].append(spawn_peak(t, args.peak_size))
            print(f"round {r + 1}/{args.rounds}: matmul peak, {t} threads: {peaks[t][-1][0]:.1f} GFLOP/s "
                  f"(load {peaks[t][-1][1][0]:.2f}->{peaks[t][-1][1][1]:.2f})", flush=True)
        for side, loss, mode, threads in (cases(args) if r % 2 == 0 else cases(args)[::-1]):
            print(f"round {r + 1}/{args.rounds}: {label(side, mode, args.k, threads)}, {loss} ...", end=" ", flush=True)
            rec = spawn(side, loss, mode, threads, args)
            rec.update(steady(rec, args.warmup))
            uniform = (f", {100 * rec['zero_variance_share']:.0f} % of groups uniform"
                       if "zero_variance_share" in rec else "")
            compiled = (f", {rec['graphs']} graph(s) compiled, {rec['recompiles']} recompile(s), "
                        f"{rec['graph_breaks']} graph break(s), first step {rec['t'][0]:.1f} s"
                        if "graphs" in rec else "")
            print(f"{rec['cps']:.1f} completions/s, mean length {rec['mean_length']:.1f} tokens{uniform}{compiled} "
                  f"(load {rec['load'][0]:.2f}->{rec['load'][1]:.2f}, steal {100 * rec['steal']:.0f} %)", flush=True)
            results.setdefault((side, loss, mode, threads), []).append(rec)
    peak = {t: max(p for p, _ in v) for t, v in peaks.items()}
    peak_load = {t: (min(lo[0] for _, lo in v), max(max(lo) for _, lo in v)) for t, v in peaks.items()}

    def agg(key) -> dict:
        runs = results[key]
        threads = key[3] if key[3] is not None else nproc
        cps = median(x["cps"] for x in runs)
        fps = median(x["flops_per_s"] for x in runs)
        loads = [x["load"] for x in runs]
        steal = max(x.get("steal", 0.0) for x in runs)
        return {"steal": steal, "recompiles": max((x.get("recompiles", 0) for x in runs), default=0),
                "cps": cps, "fps": fps, "length": median(x["mean_length"] for x in runs),
                "frac": fps / (peak[threads] * 1e9), "mem": max(x["peak_tree_mib"] for x in runs),
                "n": len(runs), "load": (min(lo[0] for lo in loads), max(max(lo) for lo in loads)),
                "threads": threads, "torch_threads": sorted({x["threads"] for x in runs})}

    figs = {key: agg(key) for key in results}
    rows = [[short_label(side, mode, args.k, threads), loss, f["cps"], f["length"],
             f"{100 * f['frac']:.0f}%", f["mem"], f"{f['load'][0]:.1f}-{f['load'][1]:.1f}", f"{100 * f['steal']:.0f}%"]
            for (side, loss, mode, threads), f in figs.items()]
    print_table(f"RL steps {args.warmup + 1}-{args.steps} of 16 x 8, median of runs",
                ["case", "loss", "compl/s", "len", "of peak", "MiB", "load", "steal"], rows, left=2)
    print("of peak: useful FLOP/s over the fp32 matmul peak ("
          + ", ".join(f"{peak[t]:.0f} GFLOP/s at {t} thread{'s' if t > 1 else ''}" for t in peak_threads)
          + "); steal: CPU time the hypervisor took; sc-compiled: hardware.compile = true")

    def ratio(name: str, num: dict, den: dict, target: float | None = TARGET_RATIO) -> None:
        lo = (min(num["load"][0], den["load"][0]), max(num["load"][1], den["load"][1]))
        report(Figure("bench_trl", name, num["cps"] / den["cps"], "x", ">=" if target else None, target,
                      load=lo, max_load=args.max_load))

    for t in peak_threads:
        report(Figure("bench_trl", f"fp32 matmul peak ({args.peak_size}^2), {t} threads", peak[t], "GFLOP/s",
                      load=peak_load[t]))
    for (side, loss, mode, threads), f in figs.items():
        if side == "scalectl" and mode != "pipeline":
            trl_mode = "sync" if mode == "sync" else "off_policy"
            other = figs.get(("trl", loss, trl_mode, threads))
            if other:
                ratio(f"{label(side, mode, args.k, threads)} / {label('trl', trl_mode, args.k, threads)}, {loss}: "
                      "completions/s", f, other, target=None)
        report(Figure("bench_trl", f"{label(side, mode, args.k, threads)}, {loss}: useful FLOPs / FLOP limit",
                      f["frac"], "", ">=" if side == "scalectl" else None,
                      TARGET_FLOP_FRACTION if side == "scalectl" else None, load=f["load"], max_load=args.max_load))
    for loss in args.losses:
        for sc_mode, trl_mode in (("sync", "sync"), ("ppo_off_policy", "off_policy")):
            sc = [figs[k] for k in figs if k[:3] == ("scalectl", loss, sc_mode)]
            tr = [figs[k] for k in figs if k[:3] == ("trl", loss, trl_mode)]
            if sc and tr:
                best_sc, best_tr = max(sc, key=lambda f: f["cps"]), max(tr, key=lambda f: f["cps"])
                ratio(f"scalectl {sc_mode} (best: {best_sc['threads']} threads) / TRL "
                      f"{'sync' if trl_mode == 'sync' else f'steps_per_generation={args.k}'} "
                      f"(best: {best_tr['threads']} threads), {loss}: completions/s", best_sc, best_tr)
    for (side, loss, mode, threads), f in figs.items():
        if side == "compiled":
            eager = figs.get(("scalectl", loss, mode, threads))
            if eager:   # the default path must never be slower than the compiled one it could take
                ratio(f"scalectl sync eager (the default) / compiled, {threads} thread(s), {loss}: completions/s",
                      eager, f, target=None)
            report(Figure("bench_trl", f"{label(side, mode, args.k, threads)}, {loss}: recompiles after the first "
                          "graph (most of any run)", f["recompiles"], ""))
    pipe = figs.get(("scalectl", args.losses[0], "pipeline", None))
    sync_all = figs.get(("scalectl", args.losses[0], "sync", nproc))
    if pipe and sync_all:
        ratio(f"scalectl pipeline-{args.k} (cores shared) / sync ({nproc} threads), {args.losses[0]}: completions/s",
              pipe, sync_all, target=None)
    for (side, loss, mode, threads), f in figs.items():
        report(Figure("bench_trl", f"{label(side, mode, args.k, threads)}, {loss}: completions/s", f["cps"], "1/s",
                      load=f["load"]))
        report(Figure("bench_trl", f"{label(side, mode, args.k, threads)}, {loss}: peak memory", f["mem"], "MiB"))


if __name__ == "__main__":
    main()
