"""A pipeline run (PipelineRL-k) whose two generator processes are vLLM engines (CPU build)
receiving the trainer's weights by broadcast after every step: tokens at most k versions
old, and the generators' log-probs equal the trainer's recomputation on the same weights.
Runs where vllm imports (``make test-vllm``)."""

from __future__ import annotations

import importlib.util
import json
import math
from collections import Counter

import pytest

from conftest import run_cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (make test-vllm)")

P, G, K, STEPS = 4, 4, 2, 6

#: Largest |generator log-prob - trainer log-prob| accepted on a token sampled by the weights the
#: trainer holds (nats).  Both sides are float32 with a float32 LM head on identical weights (the
#: broadcast copies the bytes): what differs is the order of the sums (vLLM's CPU kernels and KV
#: cache against one teacher-forced pass of torch).  The untrained tiny model's log-probs are
#: near log(1/261) ~ -5.6, whose float32 ulp is 4.8e-7; a softmax over 261 logits that each
#: carry a few ulps of rounding moves a log-prob by ~10 ulps at most: 5e-6 < 1e-5.
TOL = 1e-5


def _weights(run_dir, version: int, policy):
    """The trainer's weights of ``version``: the initial policy for 0, else the model states of the
    checkpoint of step ``version`` (one trainer at ZeRO-0: DeepSpeed saves the whole module, whose
    parameter names are the causal LM's)."""
    import torch

    from scalectl.rl.model import load_policy

    model, _ = load_policy(str(policy), "fp32")
    if version > 0:
        path = run_dir / "checkpoints" / f"step-{version:06d}" / "engine" / "latest" / "mp_rank_00_model_states.pt"
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=False)["module"])
    return model


def _teacher_forced(model, line) -> list[float]:
    """log pi(token | context) of every completion token of a rollouts.jsonl ``line`` under
    ``model``: the trainer's function (``token_logprobs``, float32 head, temperature 1)."""
    import torch

    from scalectl.rl.model import token_logprobs

    ids = torch.tensor([line["prompt_ids"] + line["token_ids"]])
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, torch.ones_like(ids), head_fp32=True,
                                 start=len(line["prompt_ids"]) - 1, with_entropy=False)
    return logp[0].tolist()


def test_pipeline_with_two_vllm_generators(tmp_path):
    """scalerl's pipeline-2 on 2 vLLM generator processes + 1 trainer: the run completes with
    its points in the store; every trained token is at most k versions behind the trainer that
    trains on it; both generators sample with weights broadcast after training steps; and each
    token's generator log-prob equals the trainer's log-prob of it on the weights of the version
    that sampled it, within TOL.

    Where the run measures this itself: ``rollouts.jsonl`` holds the trainer's recomputation on
    the weights it trains with, which are the sampling weights only for tokens of the trainer's
    own version (here the generators run ahead, so mostly at step 0: staleness is k).  For the
    other tokens the trainer's weights of the token's version are read from the step's
    checkpoint (one per step) and passed through the trainer's ``token_logprobs``; where both
    exist they agree (the checkpoint holds the weights the trainer used).  A completion whose
    tokens span two versions (an update in flight) is compared up to the update: after it the
    KV cache holds the older weights' keys and values, which no teacher-forced pass of one
    version reproduces."""
    from scalectl.rl.model import build_tiny_model, build_tokenizer, save_policy

    policy = save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path / "policy")
    sets = ["hardware.rollout_engine=vllm", "hardware.generators=2", "hardware.trainers=1",
            "async.mode=pipeline", f"async.k={K}", f"batch.prompts_per_step={P}",
            f"batch.generations_per_prompt={G}", "eval.every_steps=3", "eval.prompts=4",
            "eval.samples_per_prompt=2", "checkpoint.every_steps=1", f"checkpoint.keep={STEPS}",
            f"budget.steps={STEPS}", "filter.zero_variance=false", "data.train_size=200", f"model.path={policy}",
            "logging.rollouts=true"]
    db, runs = tmp_path / "s.db", tmp_path / "runs"
    proc = run_cli("run", "recipes/scalerl.toml", "--runs-dir", str(runs), "--name", "vpipe",
                   *[a for s in sets for a in ("--set", s)], db=db, timeout=1500)
    run_dir = runs / "vpipe"
    if proc.returncode != 0:
        logs = "\n".join(f"== {p.name}\n{p.read_text()[-4000:]}" for p in sorted((run_dir / "logs").glob("*.log")))
        raise AssertionError(f"scalectl run failed ({proc.returncode}):\n{proc.stderr[-4000:]}\n{logs}")
    assert "2 generator process(es) and 1 trainer process(es) started (pipeline-2;" in proc.stderr

    shown = json.loads(run_cli("show", "vpipe", "--json", db=db, check=True).stdout)
    assert shown["run"]["status"] == "completed"
    assert [p["step"] for p in shown["points"]] == [0, 3, 6]
    assert [p["samples"] for p in shown["points"]] == [0, 3 * P * G, 6 * P * G]

    steps = [json.loads(x) for x in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all(0 <= s["staleness_max"] <= K for s in steps)
    assert all(s["weights_push_s"] > 0 for s in steps)

    lines = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [s for s in range(STEPS) for _ in range(P * G)]
    assert {x["generator"] for x in lines} == {0, 1}
    models = {}
    worst, worst_own, trainer_vs_ckpt = 0.0, 0.0, 0.0
    checked = {0: Counter(), 1: Counter()}      # generator -> version -> tokens compared
    for x in lines:
        vs, n = x["versions"], len(x["token_ids"])
        assert len(vs) == len(x["gen_logprobs"]) == len(x["train_logprobs"]) == n >= 1
        assert vs == sorted(vs) and all(0 <= x["step"] - v <= K for v in vs)     # staleness <= k, per token
        assert not any(math.isnan(lp) for lp in x["gen_logprobs"] + x["train_logprobs"])
        v = vs[0]
        m = vs.count(v)                          # the tokens before an update in flight
        if v not in models:
            models[v] = _weights(run_dir, v, policy)
        ref = _teacher_forced(models[v], x)
        worst = max(worst, max(abs(a - b) for a, b in zip(x["gen_logprobs"][:m], ref[:m])))
        checked[x["generator"]][v] += m
        if v == x["step"]:                       # sampled by the weights the trainer trains with
            worst_own = max(worst_own, max(abs(a - b) for a, b in zip(x["gen_logprobs"][:m], x["train_logprobs"][:m])))
            trainer_vs_ckpt = max(trainer_vs_ckpt, max(abs(a - b) for a, b in zip(x["train_logprobs"], ref)))
    print(f"\nmax |vLLM log-prob - trainer log-prob at the token's version|: {worst:.2e}; on tokens of the "
          f"trainer's own version, against its recorded recomputation: {worst_own:.2e}; recorded vs "
          f"checkpoint recomputation: {trainer_vs_ckpt:.2e}; tokens compared by generator and version: "
          f"{ {g: dict(sorted(c.items())) for g, c in checked.items()} }")
    assert worst < TOL and worst_own < TOL
    assert trainer_vs_ckpt < 1e-6          # the checkpoints hold the weights the trainer recomputed with
    # both generators sampled (and were checked) with weights pushed after training steps
    assert all(sum(n for v, n in c.items() if v >= 1) > 0 for c in checked.values()), checked
