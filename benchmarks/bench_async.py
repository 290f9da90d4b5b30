"""Throughput of the asynchrony modes: sync, PPO-off-policy-k and PipelineRL-k, side by side.

Each mode runs as its schedule says (:mod:`scalectl.rl.schedule.modes`): sync and
PPO-off-policy in one process, PipelineRL as one generator and one trainer
process (one thread each), on the same recipe and setup, for the same number
of steps, through the same training loop.  Every step trains on the full batch (the filters
are switched off unless ``--keep-filters``), so each step costs the same.

Printed per mode: samples/s and tokens/s (completions and completion tokens
consumed by the trainer, over the compute wall-clock, which excludes
evaluation and checkpoints), the generator's and the trainer's idle shares
(after the first step), and the staleness of the trained tokens (max, mean,
share of completions spanning more than one policy version).  Overlapping
generation and training pays only when the machine has a free core for each
process: a check first times one single-threaded matmul loop alone and two at
once, and prints the parallel capacity (2.0: two free cores; 1.0: none).

On a shared machine the load drifts during the benchmark: ``--repeats N`` runs
the modes N times in turn (sync, ppo, pipeline, sync, ...) and keeps each
mode's fastest run.

    .venv/bin/python benchmarks/bench_async.py [--steps 24] [--k 8] [--repeats 2] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


_SPIN = ("import time, torch; torch.set_num_threads(1); a = torch.randn(256, 256); t = time.perf_counter()\n"
         "for _ in range(1500): a = torch.tanh(a @ a)\nprint(time.perf_counter() - t)")


def parallel_capacity() -> float:
    """How many single-threaded workloads this machine runs at once at full speed (1.0 to 2.0 for two)."""
    import subprocess
    import sys

    def spin(n: int) -> list[float]:
        procs = [subprocess.Popen([sys.executable, "-c", _SPIN], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True) for _ in range(n)]
        return [float(p.communicate()[0]) for p in procs]

    alone = spin(1)[0]
    return 2 * alone / max(spin(2))


def run_mode(mode: str, args, folder: Path) -> dict:
    """One run of ``mode``; returns throughput, idle shares and staleness."""
    from scalectl.job.body import StoreSink
    from scalectl.recipe.load import load
    from scalectl.rl.data.splits import load_prompt_sets
    from scalectl.rl.loop import Reporter
    from scalectl.rl.run import run_training
    from scalectl.rl.schedule.modes import schedule_for
    from scalectl.store.database import Store

    overrides = [f"async.mode={mode}", f"async.k={args.k}", f"budget.steps={args.steps}",
                 f"eval.every_steps={args.steps}", f"eval.prompts={args.eval_prompts}", "eval.samples_per_prompt=1",
                 f"checkpoint.every_steps={args.steps + 1}", f"batch.prompts_per_step={args.prompts}",
                 f"batch.generations_per_prompt={args.generations}"]
    if args.model:
        overrides.append(f"model.path={args.model}")
    if not args.keep_filters:
        overrides += ["filter.zero_variance=false", "filter.retire_solved=false", "filter.dynamic_sampling=false"]
    recipe = load(args.recipe, args.setup, overrides)
    schedule = schedule_for(recipe.async_)
    processes = schedule.in_processes(recipe.hardware.generators, recipe.hardware.trainers)
    run_dir = folder / mode
    run_dir.mkdir(parents=True)
    store = Store.open(folder / "bench.db")
    run_id = store.create_run(run_dir.name, recipe=recipe.to_dict(), recipe_hash=recipe.content_hash, seed=recipe.seed,
                              launcher="local", hardware=recipe.hardware.name, run_dir=str(run_dir))
    train, held_out = load_prompt_sets(recipe)
    t0 = time.perf_counter()
    run_training(recipe, run_dir, schedule=schedule, sink=StoreSink(str(folder / "bench.db"), run_id),
                 train_problems=train, eval_problems=held_out, reporter=Reporter())
    total = time.perf_counter() - t0
    last = store.points(run_id)[-1]
    store.close()
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    out = {"mode": mode, "path": "2 processes" if processes else "1 process", "steps": len(steps),
           "samples_per_s": last["samples"] / last["wall_seconds"], "tokens_per_s": last["tokens"] / last["wall_seconds"],
           "compute_s": last["wall_seconds"], "total_s": total}
    if processes and len(steps) > 1:
        first, rest = steps[0], steps[1:]
        out["trainer_idle"] = sum(s["trainer_idle_s"] for s in rest) / sum(s["step_seconds"] for s in rest)
        gwall = rest[-1]["generator_wall_s"] - first["generator_wall_s"]
        out["generator_idle"] = (rest[-1]["generator_idle_s"] - first["generator_idle_s"]) / gwall if gwall else None
        out["staleness_max"] = max(s["staleness_max"] for s in steps)
        out["staleness_mean"] = sum(s["staleness_mean"] for s in steps) / len(steps)
        out["multi_version"] = sum(s["multi_version_share"] for s in steps) / len(steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--recipe", default=str(ROOT / "recipes/scalerl.toml"))
    ap.add_argument("--setup", default=str(ROOT / "setups/tiny-cpu.toml"))
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the setup's model, warm-started)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--generations", type=int, default=8, help="generations per prompt")
    ap.add_argument("--eval-prompts", type=int, default=16)
    ap.add_argument("--modes", nargs="+", default=["sync", "ppo_off_policy", "pipeline"])
    ap.add_argument("--keep-filters", action="store_true")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over the modes; the fastest run of each is shown")
    args = ap.parse_args()

    console = Console(width=150)
    runs = list(args.modes) * args.repeats
    capacity = parallel_capacity()
    console.print(f"parallel capacity of this machine now: {capacity:.2f} (two 1-thread workloads at once "
                  "vs one alone; 2.0 = two free cores)")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, mode in enumerate(runs):
            r = run_mode(mode, args, Path(tmp) / str(i))
            console.print(f"{mode} ({r['path']}): {r['samples_per_s']:.1f} samples/s")
            results.append(r)
    best: dict = {}
    for r in results:
        key = (r["mode"], r["path"])
        if key not in best or r["samples_per_s"] > best[key]["samples_per_s"]:
            best[key] = r
    results = list(best.values())
    table = Table(title=f"asynchrony modes: {args.steps} steps of {args.prompts} x {args.generations}, k = {args.k}"
                        + (f", fastest of {args.repeats} runs" if args.repeats > 1 else ""))
    for col in ("mode", "path", "samples/s", "tokens/s", "compute s", "gen. idle", "trainer idle",
                "staleness max", "mean", "multi-version"):
        table.add_column(col, justify="left" if col in ("mode", "path") else "right")

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    for r in results:
        table.add_row(r["mode"] + (f"-{args.k}" if r["mode"] != "sync" else ""), r["path"],
                      f(r["samples_per_s"], ".1f"), f(r["tokens_per_s"], ".0f"), f(r["compute_s"], ".1f"),
                      f(r.get("generator_idle"), ".0%"), f(r.get("trainer_idle"), ".0%"),
                      f(r.get("staleness_max"), "d"), f(r.get("staleness_mean"), ".2f"),
                      f(r.get("multi_version"), ".0%"))
    console.print(table)
    console.print(f"parallel capacity {capacity:.2f} before, {parallel_capacity():.2f} after; load average "
                  f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
