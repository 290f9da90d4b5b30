"""A run killed with SIGKILL mid-way and resumed ends with the points of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, SCALECTL, run_cli


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    """A freshly initialised tiny policy: this test is about crash and resume, not learning."""
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    return str(save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("policy") / "tiny"))


def _args(policy: str, runs: Path, steps: int = 8) -> list[str]:
    sets = ["async.mode=ppo_off_policy", "async.k=2", "batch.prompts_per_step=4", "batch.generations_per_prompt=4",
            "eval.every_steps=2", "eval.prompts=16", "eval.samples_per_prompt=2", "checkpoint.every_steps=2",
            f"model.path={policy}", f"budget.steps={steps}", "length.max_new_tokens=8"]
    return ["run", "recipes/grpo.toml", "--runs-dir", str(runs)] + [a for s in sets for a in ("--set", s)]


def _points(db: Path, name: str) -> list[dict]:
    return json.loads(run_cli("show", name, "--json", db=db, check=True).stdout)["points"]


@pytest.mark.long
def test_kill_9_then_resume_gives_the_uninterrupted_points(tmp_path, policy):
    db = tmp_path / "s.db"
    env = dict(os.environ, SCALECTL_DB=str(db), COLUMNS="200")
    # a budget never reached: the kill lands mid-run however fast the machine; the resume sets the real one
    proc = subprocess.Popen([SCALECTL, *_args(policy, tmp_path / "runs", 1_000_000), "--name", "crash"], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = tmp_path / "runs" / "crash" / "checkpoints" / "latest"
    deadline = time.time() + 240
    while time.time() < deadline and not (latest.exists() and latest.read_text() >= "step-000004"):
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = [p["step"] for p in _points(db, "crash")]
    end = killed_at[-1] + 4                    # 2 evaluation steps past the last point the crash left

    run_cli("run", "--resume", "crash", "--set", f"budget.steps={end}", db=db, check=True, timeout=240)
    # the same recipe and seed trained again from step 0, on purpose (else `run` reuses "crash")
    run_cli(*_args(policy, tmp_path / "runs", end), "--name", "straight", "--new-run", db=db, check=True,
            timeout=240)

    crashed, straight = _points(db, "crash"), _points(db, "straight")
    assert [p["step"] for p in crashed] == list(range(0, end + 1, 2))   # contiguous, none twice, none lost
    for a, b in zip(crashed, straight):                                # same data order and compute
        assert (a["step"], a["tokens"], a["samples"], a["flops"]) == (b["step"], b["tokens"], b["samples"], b["flops"])
        assert a["pass_rate"] == b["pass_rate"]
    logged = [json.loads(line)["step"] for line in (tmp_path / "runs" / "crash" / "steps.jsonl").open()]
    assert logged == list(range(1, end + 1))                               # steps redone after the crash logged once
    status = {r["name"]: r["status"] for r in json.loads(run_cli("runs", "--json", db=db, check=True).stdout)}
    assert status == {"crash": "completed", "straight": "completed"}
