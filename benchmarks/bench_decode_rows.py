"""Decoding rate of the CPU rollout engine against rows per call, on one fixed piece of work.

The work is the default setup's held-out evaluation (``recipes/scalerl.toml`` +
``setups/tiny-cpu.toml``: its held-out prompts x its samples per prompt, sampled at the
evaluation's parameters from the setup's shipped warm start): the largest batch a run samples
with one policy version.  It is decoded with the engine's ``max_batch`` (rows decoded together
in one call; larger requests are split) set to each value of ``--rows``, all sides on the same
prompts, seeds, threads and lengths, in alternating order over ``--rounds`` (round 2 reversed),
after one warm-up call per side.  Each figure: completions/s and tokens/s (median over rounds),
the 1-minute load before and after each side's calls, the CPU steal over the run, and the
KV cache one call holds (rows x layers x 2 x (longest prompt + max_new_tokens) x hidden x 4
bytes: the engine's static cache, ``StaticKV``).  No target: the curve picks the default
(``hardware`` row budget), see benchmarks/README.md.

    .venv/bin/python benchmarks/bench_decode_rows.py [--rows 128 256 512 1024 4000] [--rounds 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from common import CpuSteal, Figure, Load, default_max_load, machine_line, report

ROOT = Path(__file__).resolve().parents[1]
RECIPE, SETUP = ROOT / "recipes" / "scalerl.toml", ROOT / "setups" / "tiny-cpu.toml"


def _work(prompts_limit: int | None):
    """The setup's recipe, its warm-started policy and tokenizer, the held-out prompts and the
    evaluation's sampling parameters."""
    from scalectl.recipe.load import load
    from scalectl.rl.data.splits import load_prompt_sets
    from scalectl.rl.policy.model import load_policy
    from scalectl.rl.rollout.sampling import SamplingParams
    from scalectl.rl.train.warmstart import ensure_warm_start

    recipe = load(RECIPE, SETUP, [])
    model, tokenizer = load_policy(ensure_warm_start(recipe), recipe.model.dtype)
    _, held_out = load_prompt_sets(recipe, tokenizer)
    held_out = held_out[:prompts_limit] if prompts_limit else held_out
    return recipe, model, tokenizer, [p.prompt for p in held_out], SamplingParams.for_evaluation(recipe)


def _kv_mib(model, rows: int, prompt_tokens: int, new_tokens: int) -> float:
    cfg = model.config
    kv_dim = cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    return rows * cfg.num_hidden_layers * 2 * (prompt_tokens + new_tokens) * kv_dim * 4 / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[128, 256, 512, 1024, 4000])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=None, help="first N held-out prompts (default: all)")
    ap.add_argument("--max-load", type=float, default=default_max_load())
    args = ap.parse_args()

    import torch

    from scalectl.rl.policy.model import encode_prompts
    from scalectl.rl.rollout.cpu import CPURolloutEngine

    torch.set_num_threads(args.threads)
    recipe, model, tokenizer, prompts, params = _work(args.prompts)
    k = recipe.eval.samples_per_prompt
    longest = max(len(x) for x in encode_prompts(tokenizer, prompts))
    print(machine_line())
    print(f"work: {len(prompts)} held-out prompts x {k} samples = {len(prompts) * k} completions, "
          f"at most {params.max_new_tokens} new tokens, temperature {params.temperature}, top_p {params.top_p}; "
          f"{args.threads} torch threads; rows per call {args.rows}")

    engines = {r: CPURolloutEngine(model, tokenizer, head_fp32=recipe.precision.lm_head == "fp32", max_batch=r)
               for r in args.rows}
    for r, eng in engines.items():            # warm-up: one call of each side's size
        eng.generate(prompts[:max(1, min(len(prompts), r // k))], k, params, seed=10_000)

    rates: dict[int, list[tuple[float, float, float, float]]] = {r: [] for r in args.rows}
    steal = CpuSteal()
    for rnd in range(args.rounds):
        order = args.rows if rnd % 2 == 0 else list(reversed(args.rows))
        for r in order:
            with Load() as load:
                t0 = time.perf_counter()
                groups = engines[r].generate(prompts, k, params, seed=rnd)
                dt = time.perf_counter() - t0
            n = sum(len(g) for g in groups)
            tokens = sum(len(c.token_ids) for g in groups for c in g)
            rates[r].append((n / dt, tokens / dt, load.before, load.after))
            print(f"round {rnd + 1}, {r} rows per call: {n / dt:.0f} completions/s, {tokens / dt:.0f} tokens/s "
                  f"({dt:.1f} s) [{load}]")

    table = Table(title=f"decoding rate against rows per call (median of {args.rounds} rounds; "
                        f"CPU steal {100 * steal.share():.1f} %)")
    for col in ("rows per call", "completions/s", "tokens/s", "load (before -> after)", "KV cache, MiB"):
        table.add_column(col, justify="right")
    for r in args.rows:
        c = statistics.median(x[0] for x in rates[r])
        t = statistics.median(x[1] for x in rates[r])
        lo, hi = min(x[2] for x in rates[r]), max(x[3] for x in rates[r])
        table.add_row(str(r), f"{c:.0f}", f"{t:.0f}", f"{lo:.2f} -> {hi:.2f}",
                      f"{_kv_mib(model, min(r, len(prompts) * k), longest, params.max_new_tokens):.1f}")
        report(Figure("bench_decode_rows", f"completions/s at {r} rows per call", round(c, 1), "completions/s",
                      load=(lo, hi), max_load=args.max_load))
    Console().print(table)


if __name__ == "__main__":
    main()
