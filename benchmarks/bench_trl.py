"""RL step throughput of scalectl against TRL's ``GRPOTrainer`` on the same tiny model and task.

Both sides train the tiny setup's warm start (``recipes/minimax.toml`` +
``setups/tiny-cpu.toml``) on the same synthetic arithmetic prompts (the setup's
difficulty), 16 prompts x 8 generations per step, at most ``length.max_new_tokens``
new tokens, temperature 1, the same learning rate, Adam betas and epsilon, no
weight decay, gradient clipping at ``optim.grad_clip``, a constant learning rate
(no warm-up), no KL term, FP32, on the CPU, for ``--steps`` optimiser steps; the
reward is +1/-1 from :func:`scalectl.rl.rewards.check` on both sides.

Losses (token-level aggregation on both sides, as TRL aggregates):

* ``cispo``: CISPO with eps_max 5 (scalectl ``loss.type = "cispo"``,
  ``clip_high = 5``; TRL ``loss_type = "cispo"``, ``epsilon_high = 5``);
* ``clip``: DAPO's asymmetric PPO clip 0.2 / 0.28 (scalectl ``ppo_clip``;
  TRL ``loss_type = "dapo"``, ``epsilon = 0.2``, ``epsilon_high = 0.28``).

scalectl modes: ``sync``, ``ppo_off_policy`` (k = ``--k``) through the
single-process loop (:func:`scalectl.rl.run.run_training`), ``pipeline``
(k) through the generator and trainer processes; TRL: one generation batch
per step (``steps_per_generation = 1``) and, matching PPO-off-policy-k, one
generation of k batches for k steps (``steps_per_generation = k``).

Each run is a fresh process (so its peak memory is its own), and the runs of
a round alternate between the two sides so that drift in the machine's load
hits both.  Figures per run: completions/s and completion tokens/s over the
wall-clock of the training steps (scalectl: the compute meter, which leaves
out evaluation; TRL: from ``on_train_begin`` to the last ``on_step_end``), and
the peak resident memory of the process tree (sampled every 50 ms with psutil,
reward-checker and pipeline processes included).  Target: every scalectl mode
>= 2x TRL's completions/s with equal or lower peak memory.

    python benchmarks/bench_trl.py [--steps 16] [--rounds 2] [--losses cispo clip]
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

from common import ROOT, Figure, machine_line, median, peak_rss_mib, print_table, report

RECIPE = ROOT / "recipes" / "minimax.toml"
SETUP = ROOT / "setups" / "tiny-cpu.toml"
TARGET_RATIO = 2.0
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


def load_recipe(loss: str, mode: str, k: int, steps: int, model: str | None = None):
    """The benchmark's recipe: minimax + tiny-cpu, the loss variant, the mode, no filters, no warm-up;
    ``model``: a checkpoint folder instead of the setup's (warm-started) model."""
    from scalectl.recipe_io import load

    overrides = ([f"model.path={model}"] if model else []) + LOSSES[loss][0] + [
        f"async.mode={mode}", f"async.k={k}", f"budget.steps={steps}", "optim.warmup_steps=0",
        "optim.weight_decay=0.0", "filter.zero_variance=false", "filter.retire_solved=false",
        "filter.dynamic_sampling=false", "length.control=none", "advantage.normalization=prompt",
        "precision.lm_head=fp32", "batch.prompts_per_step=16", "batch.generations_per_prompt=8",
        f"eval.every_steps={steps}", "eval.prompts=16", "eval.samples_per_prompt=1",
        f"checkpoint.every_steps={steps + 1}"]
    return load(RECIPE, SETUP, overrides)


def run_scalectl(loss: str, mode: str, k: int, steps: int, model: str | None) -> dict:
    """One scalectl training run; completions, completion tokens and seconds of its steps."""
    from scalectl.rl.data import load_prompt_sets
    from scalectl.job import StoreSink
    from scalectl.rl.loop import Reporter
    from scalectl.rl.run import run_training
    from scalectl.rl.warmstart import ensure_warm_start
    from scalectl.store import Store

    recipe = load_recipe(loss, mode, k, steps, model)
    ensure_warm_start(recipe)   # built once and cached; run_training loads it
    train, held_out = load_prompt_sets(recipe)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "bench.db")
        run_id = store.create_run("bench", recipe=recipe.to_dict(), recipe_hash=recipe.content_hash,
                                  seed=recipe.seed, run_dir=tmp)
        run_training(recipe, Path(tmp), sink=StoreSink(str(Path(tmp) / "bench.db"), run_id), train_problems=train,
                     eval_problems=held_out, reporter=Reporter())
        last = store.points(run_id)[-1]
        store.close()
    return {"completions": last["samples"], "tokens": last["tokens"], "seconds": last["wall_seconds"],
            "steps": last["step"]}


def run_trl(loss: str, mode: str, k: int, steps: int, model: str | None) -> dict:
    """One TRL GRPOTrainer run (CPU, transformers generate); completions, tokens and seconds of its steps."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from scalectl.rl.data import load_prompt_sets
    from scalectl.rl.model import load_policy
    from scalectl.rl.rewards import check
    from scalectl.rl.warmstart import ensure_warm_start

    recipe = load_recipe(loss, "sync", k, steps, model)
    model, tokenizer = load_policy(ensure_warm_start(recipe), recipe.model.dtype)
    train, _ = load_prompt_sets(recipe)
    P, G = recipe.batch.prompts_per_step, recipe.batch.generations_per_prompt
    # BOS then the prompt, as scalectl's encode_prompt (Qwen2's tokenizer adds no BOS itself)
    data = Dataset.from_list([{"prompt": tokenizer.bos_token + p.prompt, "answer": p.answer}
                              for p in train[:P * steps]])
    counted = {"completions": 0, "tokens": 0}

    def reward(prompts, completions, completion_ids, answer, **_):
        counted["completions"] += len(completions)
        counted["tokens"] += sum(len(ids) for ids in completion_ids)
        return [1.0 if check(c, a) else -1.0 for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        t0 = t1 = None

        def on_train_begin(self, *a, **kw):
            Clock.t0 = time.perf_counter()

        def on_step_end(self, *a, **kw):
            Clock.t1 = time.perf_counter()

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
    return {"completions": counted["completions"], "tokens": counted["tokens"], "seconds": Clock.t1 - Clock.t0,
            "steps": steps}


def worker(side: str, loss: str, mode: str, k: int, steps: int, model: str | None, profile: str | None) -> dict:
    """Run one side in this process and return its figures (with peak memory)."""
    import warnings

    warnings.filterwarnings("ignore")
    fn = run_scalectl if side == "scalectl" else run_trl
    profiler = None
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.005)
        profiler.start()
    with TreeMemory() as mem:
        out = fn(loss, mode, k, steps, model)
    if profiler:
        profiler.stop()
        Path(profile).write_text(profiler.output_text(show_all=False, color=False) + "\n\nself time by function:\n"
                                 + profiler.output_text(flat=True, color=False))
        profiler.last_session.save(str(Path(profile).with_suffix(".pyisession")))
    out.update(peak_tree_mib=mem.peak, peak_self_mib=peak_rss_mib())
    return out


# -- the driver ----------------------------------------------------------------------------------


def cases(args) -> list[tuple[str, str, str]]:
    """(side, loss, mode) of one round, alternating sides."""
    out = []
    for loss in args.losses:
        modes = args.modes if loss == args.losses[0] else ["sync"]
        trl_modes = ["sync"] + (["off_policy"] if loss == args.losses[0] and args.trl_off_policy else [])
        sc = [("scalectl", loss, m) for m in modes]
        tr = [("trl", loss, m) for m in trl_modes]
        while sc or tr:   # alternate scalectl / TRL
            if sc:
                out.append(sc.pop(0))
            if tr:
                out.append(tr.pop(0))
    return out


def spawn(side: str, loss: str, mode: str, args, profile: str | None = None) -> dict:
    """Run one case in a fresh process; its JSON result."""
    cmd = [sys.executable, __file__, "--worker", side, "--loss", loss, "--mode", mode, "--k", str(args.k),
           "--steps", str(args.steps)] + (["--model", args.model] if args.model else []) + (["--profile-out", profile] if profile else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{side} {loss} {mode} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def label(side: str, mode: str, k: int) -> str:
    """A case's name in the table."""
    if side == "scalectl":
        return {"sync": "scalectl sync", "ppo_off_policy": f"scalectl ppo_off_policy-{k}",
                "pipeline": f"scalectl pipeline-{k}"}[mode]
    return "TRL GRPOTrainer" + ("" if mode == "sync" else f" steps_per_generation={k}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16, help="optimiser steps per run (a multiple of --k)")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--losses", nargs="+", default=["cispo", "clip"], choices=list(LOSSES))
    ap.add_argument("--modes", nargs="+", default=["sync", "ppo_off_policy", "pipeline"],
                    help="scalectl modes (the first loss; the others run sync only)")
    ap.add_argument("--no-trl-off-policy", dest="trl_off_policy", action="store_false")
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the setup's model, warm-started)")
    ap.add_argument("--profile", default=None, help="write pyinstrument profiles of one sync run per side here")
    ap.add_argument("--worker", choices=["scalectl", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--loss", default="cispo", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="sync", help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.loss, args.mode, args.k, args.steps, args.model, args.profile_out)))
        return
    if args.steps % args.k:
        ap.error(f"--steps {args.steps} must be a multiple of --k {args.k}")
    print(machine_line())
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        for side in ("scalectl", "trl"):
            spawn(side, args.losses[0], "sync", args, str(Path(args.profile) / f"{side}.txt"))
        print(f"profiles written to {args.profile}/scalectl.txt and trl.txt")
        return
    results: dict[tuple, list[dict]] = {}
    for r in range(args.rounds):
        for side, loss, mode in cases(args):
            print(f"round {r + 1}/{args.rounds}: {label(side, mode, args.k)}, {loss} ...", flush=True)
            results.setdefault((side, loss, mode), []).append(spawn(side, loss, mode, args))

    def agg(key) -> dict:
        runs = results[key]
        return {"cps": median(x["completions"] / x["seconds"] for x in runs),
                "tps": median(x["tokens"] / x["seconds"] for x in runs),
                "mem": max(x["peak_tree_mib"] for x in runs), "n": len(runs)}

    figs = {key: agg(key) for key in results}
    rows = []
    for (side, loss, mode), f in figs.items():
        base = figs[("trl", loss, "sync")]
        rows.append([f"{label(side, mode, args.k)}", loss, f["cps"], f["tps"], f["mem"],
                     f"{f['cps'] / base['cps']:.2f}x", f"{f['mem'] / base['mem']:.2f}x", str(f["n"])])
    print_table(f"RL step throughput: {args.steps} steps of 16 prompts x 8 generations (median of runs)",
                ["run", "loss", "completions/s", "tokens/s", "peak MiB", "speed vs TRL", "memory vs TRL", "runs"],
                rows, left=2)
    for (side, loss, mode), f in figs.items():
        if side != "scalectl":
            continue
        base = figs[("trl", loss, "sync")]
        name = f"{label(side, mode, args.k)} / TRL, {loss}"
        report(Figure("bench_trl", f"{name}: completions/s ratio", f["cps"] / base["cps"], "x", ">=", TARGET_RATIO))
        report(Figure("bench_trl", f"{name}: peak memory ratio", f["mem"] / base["mem"], "x", "<=", 1.0))
        if mode != "sync" and ("trl", loss, "off_policy") in figs:
            off = figs[("trl", loss, "off_policy")]
            report(Figure("bench_trl", f"{name} steps_per_generation={args.k}: completions/s ratio",
                          f["cps"] / off["cps"], "x", ">=", TARGET_RATIO))
    for (side, loss, mode), f in figs.items():
        report(Figure("bench_trl", f"{label(side, mode, args.k)}, {loss}: completions/s", f["cps"], "1/s"))
        report(Figure("bench_trl", f"{label(side, mode, args.k)}, {loss}: tokens/s", f["tps"], "1/s"))
        report(Figure("bench_trl", f"{label(side, mode, args.k)}, {loss}: peak memory", f["mem"], "MiB"))


if __name__ == "__main__":
    main()
