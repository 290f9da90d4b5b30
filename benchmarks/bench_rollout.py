"""Generation speed of the CPU rollout engine against transformers' ``model.generate``.

Same model (the tiny Qwen2, random weights or a checkpoint), same prompts, same
batch, sampling at temperature 1 with the full softmax, at most ``--new-tokens``
per row; both stop a row at EOS and the batch when every row has stopped.
Tokens counted: the completion tokens actually generated (EOS included).  Prints
tokens/s side by side and the ratio (best of ``--repeats``).  Target: the engine
at least as fast as ``model.generate`` (ratio >= 1), although it also records
every sampled token's log-prob.

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

from common import Figure, report

TARGET_RATIO = 1.0


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the tiny model, random weights)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.checkpoint:
        model, tokenizer = load_policy(args.checkpoint)
    else:
        model, tokenizer = build_tiny_model(0), build_tokenizer()
    table = Table(title=f"rollout tokens/s ({args.new_tokens} new tokens per row, {torch.get_num_threads()} threads)")
    for col in ("batch", "CPURolloutEngine", "model.generate", "ratio"):
        table.add_column(col, justify="right")
    ratios = {}
    for batch in args.batch:
        prompts = [p.prompt for p in eval_problems(batch, seed=1, difficulty=3)]
        engine = CPURolloutEngine(model, tokenizer, head_fp32=True, max_batch=batch)
        engine.generate(prompts[:8], 1, SamplingParams(max_new_tokens=4))  # warm-up
        ours = _engine_tps(engine, prompts, args.new_tokens, args.repeats)
        theirs = _hf_tps(model, tokenizer, prompts, args.new_tokens, args.repeats)
        table.add_row(str(batch), f"{ours:,.0f}", f"{theirs:,.0f}", f"{ours / theirs:.2f}")
        ratios[batch] = (ours, ours / theirs)
    Console().print(table)
    for batch, (ours, ratio) in ratios.items():
        report(Figure("bench_rollout", f"CPU engine tokens/s, batch {batch}", ours, "1/s"))
        report(Figure("bench_rollout", f"CPU engine / model.generate tokens/s, batch {batch}", ratio, "x",
                      ">=", TARGET_RATIO))


if __name__ == "__main__":
    main()
