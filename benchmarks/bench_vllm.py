"""Generation speed of the vLLM rollout engine against ``LLM.generate`` on the same requests.

One ``vllm.LLM`` (the CPU build: ``make test-vllm`` makes ``.venv-vllm``), the tiny Qwen2
checkpoint (random weights: completions rarely stop early, so both sides generate about the
same tokens), P prompts x G completions of at most ``--new-tokens`` each, sampled at
temperature 1 with the generator's log-prob of every token.  The two sides get the same
requests: one per completion, with the engine's own per-request seeds and parameters
(:func:`scalectl.rl.rollout.vllm.request_seed`, :func:`~scalectl.rl.rollout.vllm.request_params`:
``logprobs=0``, its stop ids), the engine's settings (the
in-process engine core without async scheduling).  :class:`~scalectl.rl.rollout.vllm.VLLMRolloutEngine`
tags every token with its policy version; ``LLM.generate`` does not.  Calls alternate (engine,
``LLM.generate``, then ``LLM.generate``, engine, ...) so that both see the same load and
neither is always the one that finds the other's prompts in the prefix cache; the 1-minute load average is
recorded around each.  Target: the engine within 10 % of ``LLM.generate`` (ratio >= 0.9).

    .venv-vllm/bin/python benchmarks/bench_vllm.py [--prompts 32] [--group 8] [--new-tokens 48] [--rounds 4]

Without vllm (the project's own environment) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import Figure, Load, default_max_load, machine_line, report

TARGET_RATIO = 0.9


def _engine_call(engine, prompts, group, params, seed):
    t0 = time.perf_counter()
    out = engine.generate(prompts, group, params, seed=seed)
    seconds = time.perf_counter() - t0
    return sum(len(c.token_ids) for g in out for c in g), seconds


def _generate_call(engine, prompts, group, new_tokens, seed):
    """The same requests through ``LLM.generate``: one per completion, the engine's prompt ids and seeds."""
    from vllm import SamplingParams as VSP
    from vllm.inputs import TokensPrompt

    from scalectl.rl.policy.model import encode_prompts
    from scalectl.rl.rollout.vllm import request_params, request_seed

    ids = [ids for ids in encode_prompts(engine.tokenizer, prompts) for _ in range(group)]
    sample = dict(temperature=1.0, top_p=1.0, logprobs=0)
    params = [VSP(**request_params(new_tokens, request_seed(seed, r, 0), sample, engine.stop_ids))
              for r in range(len(ids))]
    t0 = time.perf_counter()
    out = engine.llm.generate([TokensPrompt(prompt_token_ids=x) for x in ids], params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in out), seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=4, help="alternating pairs of calls after one warm-up pair")
    ap.add_argument("--max-load", type=float, default=default_max_load())
    args = ap.parse_args(argv)
    print(machine_line())
    if importlib.util.find_spec("vllm") is None:
        print("skipped: vllm is not installed here (make test-vllm builds .venv-vllm; run this script with "
              ".venv-vllm/bin/python)")
        return 0
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from scalectl.rl.data.arithmetic import eval_problems
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy
    from scalectl.rl.rollout.sampling import SamplingParams
    from scalectl.rl.rollout.vllm import VLLMRolloutEngine

    path = save_policy(build_tiny_model(seed=0), build_tokenizer(), Path(tempfile.mkdtemp()) / "policy")
    engine = VLLMRolloutEngine(path, build_tokenizer(), dtype="fp32", head_fp32=True, max_model_len=256, seed=0,
                               enforce_eager=True)
    prompts = [p.prompt for p in eval_problems(args.prompts, seed=1, difficulty=2)]
    params = SamplingParams(max_new_tokens=args.new_tokens)
    rates = {"engine": [], "generate": []}
    loads = []
    for r in range(args.rounds + 1):
        with Load() as load:       # which side goes first alternates too (the second may hit the prefix cache)
            if r % 2:
                b = _generate_call(engine, prompts, args.group, args.new_tokens, seed=r)
                a = _engine_call(engine, prompts, args.group, params, seed=r)
            else:
                a = _engine_call(engine, prompts, args.group, params, seed=r)
                b = _generate_call(engine, prompts, args.group, args.new_tokens, seed=r)
        if r == 0:
            continue                                   # warm-up pair
        loads.append((load.before, load.after))
        rates["engine"].append(a[0] / a[1])
        rates["generate"].append(b[0] / b[1])
        print(f"round {r}: engine {a[0]} tokens in {a[1]:.2f} s ({a[0] / a[1]:,.0f}/s), LLM.generate {b[0]} tokens "
              f"in {b[1]:.2f} s ({b[0] / b[1]:,.0f}/s), {load}")
    span = (min(x for x, _ in loads), max(y for _, y in loads))
    eng, gen = statistics.median(rates["engine"]), statistics.median(rates["generate"])
    size = f"{args.prompts} x {args.group} x <= {args.new_tokens} tokens"
    report(Figure("bench_vllm", f"vLLM engine tokens/s ({size}, CPU build)", eng, "tokens/s", load=span,
                  max_load=args.max_load))
    report(Figure("bench_vllm", f"LLM.generate tokens/s (same requests)", gen, "tokens/s", load=span,
                  max_load=args.max_load))
    report(Figure("bench_vllm", "vLLM engine / LLM.generate", eng / gen, "x", ">=", TARGET_RATIO, load=span,
                  max_load=args.max_load))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
