"""A mixture-of-experts policy through the whole loop on CPU: a tiny Qwen2-MoE (4 experts, 2 per
token) built from a config, saved as a checkpoint folder and named by ``model.path`` like any
other: the CPU engine's log-probs, a pipeline run (DeepSpeed steps, weight pushes, points), and the
ZeRO-3 push of its experts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, run_cli
from scalectl.rl.policy.model import build_tiny_moe, build_tokenizer, checkpoint_state, save_policy


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory) -> str:
    return str(save_policy(build_tiny_moe(seed=0), build_tokenizer(), tmp_path_factory.mktemp("moe") / "moe"))


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_the_tiny_moe_is_a_checkpoint_like_any_other(moe_path, one_torch_thread):
    """Saved and loaded, the MoE is the same model; its experts are fused in memory (transformers
    5) and one tensor per expert in the checkpoint, and checkpoint_state maps one to the other; the
    CPU engine's log-probs equal a teacher-forced pass."""
    from safetensors import safe_open

    from scalectl.rl.policy.logprobs import token_logprobs
    from scalectl.rl.policy.model import load_policy
    from scalectl.rl.rollout.cpu import CPURolloutEngine
    from scalectl.rl.rollout.sampling import SamplingParams

    model, tok = load_policy(moe_path, "fp32")
    built = build_tiny_moe(seed=0)
    assert type(model).__name__ == "Qwen2MoeForCausalLM"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), built.state_dict().values()))
    state = model.state_dict()
    fused = state["model.layers.0.mlp.experts.gate_up_proj"]
    assert fused.shape == (4, 2 * 64, 128)                         # (experts, gate and up, hidden)
    with safe_open(f"{moe_path}/model.safetensors", "pt") as f:
        saved = set(f.keys())
    converted = checkpoint_state(model, state)
    assert set(converted) == saved                                  # the checkpoint's names
    assert torch.equal(converted["model.layers.0.mlp.experts.3.up_proj.weight"], fused[3, 64:])
    assert torch.equal(converted["model.layers.0.mlp.experts.3.gate_proj.weight"], fused[3, :64])
    engine = CPURolloutEngine(model, tok)
    comps = [c for g in engine.generate(["12+34=", "7-9+100="], 3, SamplingParams(max_new_tokens=16), seed=1)
             for c in g]
    worst = 0.0
    for c in comps:
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            logp, _ = token_logprobs(model, ids, torch.ones_like(ids), start=len(c.prompt_ids) - 1, with_entropy=False)
        worst = max(worst, (logp[0] - torch.tensor(c.logprobs)).abs().max().item())
    assert worst < 1e-5


@pytest.mark.slow
def test_a_tiny_moe_trains_through_the_pipeline(tmp_path, moe_path):
    """scalerl's pipeline-1 on the MoE (1 generator + 1 trainer process): DeepSpeed steps, a weight
    push after every step carrying every expert, the CPU engine sampling with them, the points in
    the store; the dry run counts the MoE's parameters from its config."""
    P, G = 4, 4
    sets = [f"model.path={moe_path}", f"batch.prompts_per_step={P}", f"batch.generations_per_prompt={G}",
            "eval.prompts=8", "eval.samples_per_prompt=2", "eval.every_steps=2", "checkpoint.every_steps=2",
            "async.k=1", "data.train_size=200", "budget.steps=4", "filter.zero_variance=false", "hardware.threads=1"]
    args = [a for s in sets for a in ("--set", s)]
    db = tmp_path / "s.db"
    dry = run_cli("run", "recipes/scalerl.toml", "--dry-run", "--json", *args, db=db)
    assert dry.returncode == 0, dry.stderr
    n = _n_params(build_tiny_moe(seed=0))
    assert json.loads(dry.stdout)["layout"]["memory"]["params"] == n
    run_cli("run", "recipes/scalerl.toml", "--name", "moe", "--runs-dir", str(tmp_path / "runs"), *args,
            db=db, check=True, timeout=600)
    shown = json.loads(run_cli("show", "moe", "--json", db=db, check=True).stdout)
    assert shown["run"]["status"] == "completed"
    assert [p["step"] for p in shown["points"]] == [0, 2, 4]
    assert [p["samples"] for p in shown["points"]] == [0, 2 * P * G, 4 * P * G]
    steps = [json.loads(line) for line in (tmp_path / "runs" / "moe" / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4] and all(s["staleness_max"] <= 1 for s in steps)
    pushed = [s["weights_push_bytes_per_s"] * s["weights_push_s"] for s in steps]
    assert all(b == pytest.approx(8 + 4 * n, rel=1e-9) for b in pushed[1:])     # the header and every weight


@pytest.mark.slow   # 10-25 s on a quiet machine, as the dense model's
def test_a_zero3_leader_pushes_the_moe_a_zero0_leader_would(tmp_path):
    """Two trainer ranks take one step on the MoE at ZeRO 0, then at ZeRO 3 with every parameter
    partitioned (the fused experts included), and the leader pushes to a generator each time: the
    ZeRO-3 push, gathered, equals the ZeRO-0 push within fp32 rounding (the same step, reduced in
    another order), and the generator loads what was sent, bit for bit."""
    worker = str(ROOT / "tests" / "zero3_push_worker.py")
    out = str(tmp_path / "z")
    from scalectl.rl.transport.roles import free_port

    port, weights_port = free_port(), free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, worker, str(r), str(port), str(weights_port), out, "moe"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(3)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    pushed, got = torch.load(f"{out}.0.pt"), torch.load(f"{out}.2.pt")
    assert got["ended"] and got["loads"] == 2
    init = build_tiny_moe(seed=0).state_dict()
    params = dict(build_tiny_moe(seed=0).named_parameters())
    assert "model.layers.1.mlp.experts.down_proj" in params
    assert pushed["1/partition"] == {k: (p.numel(), False) for k, p in params.items()}
    assert pushed["2/partition"] == {k: (0, True) for k in params}         # ZeRO-3: every tensor partitioned
    nbytes = sum(t.numel() * t.element_size() for t in init.values())
    for v in (1, 2):
        assert pushed[f"{v}/stats"][0] == 8 + nbytes
        for name, t in pushed[v].items():
            assert torch.equal(got["versions"][v][name], t), (v, name)
    moved = set()
    for name, t in init.items():
        z0, z3 = got["versions"][1][name], got["versions"][2][name]
        torch.testing.assert_close(z3, z0, rtol=1e-5, atol=1e-6)
        if not torch.equal(z0, t):
            moved.add(name)
    # the step moved the routed experts and the router of every layer
    assert {f"model.layers.{i}.mlp.experts.{w}" for i in (0, 1) for w in ("gate_up_proj", "down_proj")} <= moved
    assert {f"model.layers.{i}.mlp.gate.weight" for i in (0, 1)} <= moved
