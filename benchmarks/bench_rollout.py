"""Generation speed of the CPU rollout engine against transformers' ``model.generate``.

Same model (the tiny Qwen2, random weights or a checkpoint), same prompts, same
batch, sampling at temperature 1 with the full softmax, at most ``--new-tokens``
per row; both stop a row at EOS and the batch when every row has stopped.
Tokens counted: the completion tokens actually generated (EOS included).  The
engine runs twice: eager (static KV cache) and with its decoding step compiled
(``compile_step``, inductor; eager with a warning where no C++ compiler is
found).  Each side first runs the same warm-up batch, timed and printed (for the
compiled engine that is the trace and, without a cached build in
``~/.cache/scalectl/inductor``, the C++ build: the cost of its first step), then
tokens/s is the best of ``--repeats``; the load average before and after each
figure is printed, and ratios get no verdict above ``--max-load``.  Targets:
the eager engine at least as fast as ``model.generate`` (it also records every
sampled token's log-prob), the compiled engine 2x.

    .venv/bin/python benchmarks/bench_rollout.py [--batch 128 512] [--new-tokens 24] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import time

import torch
from rich.console import Console
from rich.table import Table

from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, encode_prompt, load_policy
from scalectl.rl.rollout.cpu import CPURolloutEngine
from scalectl.rl.rollout.sampling import SamplingParams
from scalectl.rl.data.arithmetic import eval_problems

from common import Figure, Load, default_max_load, report

TARGET_RATIO = 1.0
TARGET_COMPILED_RATIO = 2.0


def _engine_tps(engine: CPURolloutEngine, prompts: list[str], new_tokens: int, repeats: int) -> float:
    best = float("inf")
    for r in range(repeats):
        t0 = time.perf_counter()
        groups = engine.generate(prompts, 1, SamplingParams(max_new_tokens=new_tokens), seed=r)
        best = min(best, time.perf_counter() - t0)
    n_tokens = sum(len(c.token_ids) for g in groups for c in g)
    return n_tokens / best


def _hf_tps(model, tokenizer, prompts: list[str], new_tokens: int, repeats: int) -> float:
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    P = max(map(len, ids))
    input_ids = torch.full((len(ids), P), tokenizer.pad_token_id)
    mask = torch.zeros_like(input_ids)
    for r, x in enumerate(ids):
        input_ids[r, P - len(x):], mask[r, P - len(x):] = torch.tensor(x), 1
    best = float("inf")
    for r in range(repeats):
        torch.manual_seed(r)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        best = min(best, time.perf_counter() - t0)
    new = out[:, P:]
    # tokens up to and including the first EOS (later slots are padding)
    after_eos = (new == tokenizer.eos_token_id).long().cumsum(-1) - (new == tokenizer.eos_token_id).long()
    return int((after_eos == 0).sum()) / best


def _warm_up(fn) -> float:
    """Seconds of one warm-up call (the first batch's costs: allocation, tracing, compiling)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the tiny model, random weights)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-load", type=float, default=default_max_load())
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.checkpoint:
        model, tokenizer = load_policy(args.checkpoint)
    else:
        model, tokenizer = build_tiny_model(0), build_tokenizer()
    warm = [p.prompt for p in eval_problems(8, seed=2, difficulty=3)]
    eager = CPURolloutEngine(model, tokenizer, head_fp32=True)
    compiled = CPURolloutEngine(model, tokenizer, head_fp32=True, compile_step=True)
    first = {name: _warm_up(lambda e=e: e.generate(warm, 1, SamplingParams(max_new_tokens=4)))
             for name, e in (("eager", eager), ("compiled", compiled))}
    first["generate"] = _warm_up(lambda: _hf_tps(model, tokenizer, warm, 4, 1))
    print(f"first batch (8 rows, 4 tokens; includes compiling): eager engine {first['eager']:.2f} s, compiled "
          f"engine {first['compiled']:.2f} s ({'compiled' if compiled._step.compiled else 'fell back to eager'}), "
          f"model.generate {first['generate']:.2f} s")
    table = Table(title=f"rollout tokens/s ({args.new_tokens} new tokens per row, {torch.get_num_threads()} threads)")
    for col in ("batch", "engine eager", "engine compiled", "model.generate", "eager ratio", "compiled ratio",
                "load"):
        table.add_column(col, justify="right")
    figures = []
    for batch in args.batch:
        prompts = [p.prompt for p in eval_problems(batch, seed=1, difficulty=3)]
        with Load() as load:
            rates = {}
            for name, engine in (("eager", eager), ("compiled", compiled)):
                engine.max_batch = batch
                rates[name] = _engine_tps(engine, prompts, args.new_tokens, args.repeats)
            rates["generate"] = _hf_tps(model, tokenizer, prompts, args.new_tokens, args.repeats)
        lo = (load.before, load.after)
        table.add_row(str(batch), f"{rates['eager']:,.0f}", f"{rates['compiled']:,.0f}", f"{rates['generate']:,.0f}",
                      f"{rates['eager'] / rates['generate']:.2f}", f"{rates['compiled'] / rates['generate']:.2f}",
                      str(load))
        figures += [
            Figure("bench_rollout", f"CPU engine tokens/s, batch {batch}", rates["eager"], "1/s", load=lo,
                   max_load=args.max_load),
            Figure("bench_rollout", f"CPU engine, compiled step, tokens/s, batch {batch}", rates["compiled"], "1/s",
                   load=lo, max_load=args.max_load),
            Figure("bench_rollout", f"CPU engine / model.generate tokens/s, batch {batch}",
                   rates["eager"] / rates["generate"], "x", ">=", TARGET_RATIO, load=lo, max_load=args.max_load),
            Figure("bench_rollout", f"CPU engine compiled / model.generate tokens/s, batch {batch}",
                   rates["compiled"] / rates["generate"], "x", ">=", TARGET_COMPILED_RATIO, load=lo,
                   max_load=args.max_load),
        ]
    Console().print(table)
    report(Figure("bench_rollout", "compiled engine, first batch (trace and build)", first["compiled"], "s"))
    for fig in figures:
        report(fig)


if __name__ == "__main__":
    main()
