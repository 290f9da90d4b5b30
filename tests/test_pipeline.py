"""Streaming RL across processes (PipelineRL-k): in-flight weight updates over the real
weight channel, the staleness bound, failure of a process, checkpoint and resume."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import SCALECTL, run_cli
from scalectl.launch.local import pid_alive
from scalectl.rl.transport.roles import Task, free_port
from scalectl.rl.train.batch import build_train_batch
from scalectl.rl.rollout.groups import Group
from scalectl.rl.policy.model import build_tiny_model, build_tokenizer
from scalectl.rl.policy.logprobs import head_log_softmax, token_logprobs
from scalectl.rl.schedule.feeder import staleness_stats
from scalectl.rl.batches.filters import PromptSampler
from scalectl.recipe.async_modes import async_mode
from scalectl.recipe.schema import Async
from scalectl.rl.rollout.cpu import CPURolloutEngine
from scalectl.rl.rollout.sampling import SamplingParams
from scalectl.rl.transport.stream import Channel, WeightSlot, end_weights, push_weights, weight_layout

PROMPT = "12+34-5="
T, S = 16, 7          # completion length; the weights change before the forward pass of call S


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _never_stops():
    """A small untrained model that never samples EOS, so every row runs T tokens."""
    m = build_tiny_model(seed=0, num_hidden_layers=2, hidden_size=64, intermediate_size=128)
    bias = torch.zeros(m.config.vocab_size)
    bias[m.config.eos_token_id] = -1e4
    m.lm_head.bias = torch.nn.Parameter(bias)
    return m


def _channel_pair():
    """The generator's (rank 0) and trainer's (rank 1) channels of a two-task job, in this process."""
    port = free_port()
    tasks = [Task(role, r, 2, r, 0, 1, "127.0.0.1", port, "env") for r, role in enumerate(("generator", "trainer"))]
    out = [None, None]

    def join(r):
        out[r] = Channel.connect(tasks[r], timeout_s=60)

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _sample_with_update(tok, v0, v1):
    """Sample 2 completions with weights ``v0``; the trainer side sends ``v1`` (version 1) over the
    weight channel (the broadcast) so that it lands just before forward pass number S."""
    gen, trainer = _channel_pair()
    engine = CPURolloutEngine(copy.deepcopy(v0), tok, version=0)
    slot = WeightSlot(gen.groups["weights"], 1, engine, weight_layout(engine.model))
    calls = {"n": 0}

    def poll():
        calls["n"] += 1
        if calls["n"] == S:
            stats = push_weights(trainer.groups["weights"], v1, 1)
            assert stats.bytes == 8 + sum(n for *_, n in weight_layout(v1))   # the header, then the weights
            assert slot.poll(wait=True)
        else:
            assert not slot.poll()

    engine.poll_weights = poll
    comps = engine.generate([PROMPT], 2, SamplingParams(max_new_tokens=T), seed=3)[0]
    end_weights(trainer.groups["weights"], weight_layout(v1))     # the trainer's last word
    slot.drain()
    assert slot.ended and not slot.poll()
    return comps, slot


def _forced(model, c):
    """Teacher-forced log-probs of completion ``c`` under ``model`` (no padding)."""
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, torch.ones_like(ids), start=len(c.prompt_ids) - 1)
    return logp[0]


def _stale_cache_replay(m0, m1, c):
    """Log-probs with the engine's in-flight semantics, computed in two teacher-forced chunks:
    the prompt and tokens 0..S-3 by ``m0`` (their KV cache), then tokens S-2.. by ``m1`` on that cache."""
    from transformers import DynamicCache

    p = len(c.prompt_ids)
    seq = c.prompt_ids + c.token_ids
    cache = DynamicCache(config=m0.config)
    with torch.no_grad():
        a = m0.model(input_ids=torch.tensor([seq[:p + S - 2]]), cache=cache, use_cache=True).last_hidden_state
        pos = torch.arange(p + S - 2, p + T - 1).unsqueeze(0)
        b = m1.model(input_ids=torch.tensor([seq[p + S - 2:p + T - 1]]), position_ids=pos, cache=cache,
                     use_cache=True).last_hidden_state
        la = head_log_softmax(m0, a[:, p - 1:], head_fp32=True)
        lb = head_log_softmax(m1, b, head_fp32=True)
    logp = torch.cat([la, lb], dim=1)[0]
    return logp.gather(-1, torch.tensor(c.token_ids).unsqueeze(-1)).squeeze(-1)


def test_in_flight_update_head_only_logprobs_and_ratios(tok):
    """Weights that differ only after the last layer (final norm, LM head) leave the KV cache
    valid: every recorded log-prob equals the teacher-forced log-prob under the weights of the
    version recorded for its token, and the trainer's importance ratio is 1 on the tokens of its
    own version and pi_1 / pi_0 on the older ones."""
    v0 = _never_stops()
    v1 = copy.deepcopy(v0)
    with torch.no_grad():
        v1.model.norm.weight.mul_(1.5)
        v1.lm_head.weight.add_(0.05 * torch.randn_like(v1.lm_head.weight))
    comps, slot = _sample_with_update(tok, v0, v1)
    assert slot.loads == 1
    for c in comps:
        assert c.versions == [0] * (S - 1) + [1] * (T - S + 1)      # two versions in one completion
        rec = torch.tensor(c.logprobs)
        f0, f1 = _forced(v0, c), _forced(v1, c)
        assert torch.allclose(rec[:S - 1], f0[:S - 1], atol=1e-5)
        assert torch.allclose(rec[S - 1:], f1[S - 1:], atol=1e-5)
        assert (f1[:S - 1] - f0[:S - 1]).abs().max() > 1e-2       # the versions do differ
    # the trainer (holding version 1) builds its batch from the recorded log-probs
    group = Group(0, comps, [False, True], torch.tensor([-1.0, 1.0]))
    batch = build_train_batch([group], "prompt", tok.pad_token_id)
    with torch.no_grad():
        logp, _ = token_logprobs(v1, batch.input_ids, batch.attention_mask, start=batch.start)
    ratio = (logp - batch.gen_logp).exp()
    for i, c in enumerate(comps):
        assert torch.allclose(ratio[i, S - 1:T], torch.ones(T - S + 1), atol=1e-4)
        expect = (_forced(v1, c) - _forced(v0, c))[:S - 1].exp()
        assert torch.allclose(ratio[i, :S - 1], expect, atol=1e-4)


def test_in_flight_update_keeps_the_stale_kv_cache(tok):
    """A full weight update: tokens before it match version 0 exactly; tokens after it match
    version 1 computed on the KV cache version 0 left (kept, not recomputed), which differs
    from a fresh version-1 pass."""
    v0 = _never_stops()
    v1 = copy.deepcopy(v0)
    with torch.no_grad():
        for p in v1.parameters():
            p.add_(0.05 * torch.randn_like(p))
    comps, _ = _sample_with_update(tok, v0, v1)
    for c in comps:
        assert c.versions == [0] * (S - 1) + [1] * (T - S + 1)
        rec = torch.tensor(c.logprobs)
        assert torch.allclose(rec[:S - 1], _forced(v0, c)[:S - 1], atol=1e-5)
        assert torch.allclose(rec, _stale_cache_replay(v0, v1, c), atol=1e-5)
        assert (rec[S:] - _forced(v1, c)[S:]).abs().max() > 1e-3


def test_staleness_stats_and_bounds():
    # trainer version 5; completions with token versions (3, 3, 4) and (5, 5): lags 2 2 1 0 0
    st = staleness_stats(5, [[3, 3, 4], [5, 5]])
    assert st == {"staleness_max": 2, "staleness_mean": 1.0, "multi_version_share": 0.5, "tokens": 5,
                  "completions": 2}
    bounds = [async_mode(Async(mode=m, k=8)).staleness_bound for m in ("pipeline", "ppo_off_policy", "sync")]
    assert bounds == [8, 7, 0]


# --------------------------------------------------------------------------- the processes


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    """A freshly initialised tiny policy (no warm start: these tests are about the processes)."""
    from scalectl.rl.policy.model import save_policy

    return str(save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("policy") / "tiny"))


P, G, K = 8, 8, 1
TINY = ["--set", "batch.prompts_per_step=8", "--set", "batch.generations_per_prompt=8",
        "--set", "eval.prompts=16", "--set", "eval.samples_per_prompt=2", "--set", "eval.every_steps=3",
        "--set", "checkpoint.every_steps=3", "--set", f"async.k={K}", "--set", "data.train_size=400",
        "--set", "budget.steps=9", "--set", "budget.no_signal_steps=0"]   # an untrained policy


def _wait(cond, timeout=180.0, what="it"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := cond()):
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _launch(tmp_path, policy, name, *extra):
    db, runs = tmp_path / "s.db", tmp_path / "runs"
    env = dict(os.environ, SCALECTL_DB=str(db), COLUMNS="200")
    args = ["run", "recipes/scalerl.toml", "--name", name, "--runs-dir", str(runs),
            "--set", f"model.path={policy}", *TINY, *extra]
    proc = subprocess.Popen([SCALECTL, *args], cwd=Path(__file__).resolve().parents[1], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = runs / name
    try:
        _wait(lambda: (run_dir / "checkpoints" / "latest").exists(), what="the step-3 checkpoint")
    except BaseException:
        proc.kill()
        raise
    tasks = json.loads((run_dir / "pipeline" / "tasks.json").read_text())["tasks"]
    return proc, run_dir, tasks


def _stored_steps(db) -> set[int]:
    """The steps of the evaluation points in store ``db`` (read-only; none before it exists)."""
    import sqlite3

    if not Path(db).exists():
        return set()
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {row[0] for row in con.execute("SELECT step FROM eval_points")}
    except sqlite3.OperationalError:      # the tables are not made yet
        return set()
    finally:
        con.close()


def _steps(run_dir):
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_generators_two_trainers_then_a_killed_trainer_fails_the_run(tmp_path, policy):
    """A pipeline of 2 generators + 2 data-parallel trainers (4 processes) trains (every step's
    all-reduces need the second trainer rank), every token is at most k versions old, and the
    points land once per evaluation step.  SIGKILL
    on the second trainer fails the run with a message naming it and its log, and leaves no
    process behind."""
    # zero-variance groups are kept, so that every step trains (an untrained policy solves nothing)
    proc, run_dir, tasks = _launch(tmp_path, policy, "pipe", "--set", "budget.steps=1000000",
                                   "--set", "hardware.generators=2", "--set", "hardware.trainers=2",
                                   "--set", "filter.zero_variance=false")
    assert [(t["rank"], t["role"]) for t in tasks] == [(0, "generator"), (1, "generator"),
                                                        (2, "trainer"), (3, "trainer")]
    follower = tasks[3]
    # the step-3 point is evaluated in the background (eval.background = auto in a pipeline on
    # CPUs) and may land after the step-3 checkpoint: kill once it is stored
    _wait(lambda: 3 in _stored_steps(tmp_path / "s.db"), what="the step-3 point")
    shown = _kill_and_show(proc, follower["pid"], tmp_path / "s.db")
    row = shown["run"]
    assert (f"ProcessFailed: pipeline trainer process (rank 3, pid {follower['pid']}) was killed by signal "
            f"SIGKILL (log: {follower['log']})" in row["error"]), row["error"]
    assert not any(pid_alive(t["pid"]) for t in tasks)             # no orphan
    steps = _steps(run_dir)
    assert len(steps) >= 3
    assert max(s["staleness_max"] for s in steps) <= K
    assert all(s["groups_kept"] == P and not s.get("skipped") for s in steps)   # every step trained
    # the weights' pushes: version 0 and 1 in the first step, one after every step since, each the
    # same bytes (the version header and the weights)
    pushed = [s["weights_push_bytes_per_s"] * s["weights_push_s"] for s in steps]
    assert all(s["weights_push_s"] > 0 for s in steps)
    assert pushed[0] == pytest.approx(2 * pushed[1], rel=1e-9)
    assert all(b == pytest.approx(8 + 4 * 1_118_080, rel=1e-9) for b in pushed[1:])   # the tiny model in fp32
    points = shown["points"]
    assert [p["step"] for p in points][:2] == [0, 3]
    assert all(p["samples"] == p["step"] * P * G for p in points)    # P groups of G consumed per step


def _kill_and_show(proc, pid: int, db) -> dict:
    """SIGKILL process ``pid`` of the run ``proc`` started; the run exits 1 and is stored as
    failed.  Returns ``scalectl show pipe --json``."""
    try:
        os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    shown = json.loads(run_cli("show", "pipe", "--json", db=db, check=True).stdout)
    assert shown["run"]["status"] == "failed"
    return shown


def _checkpoint(run_dir, step: int) -> dict:
    return torch.load(run_dir / "checkpoints" / f"step-{step:06d}" / "state.pt", weights_only=False)


def _prompt_order(sampler_state: dict, n: int | None = None) -> list[int]:
    """The first ``n`` prompts a fresh sampler draws with nothing retired (default: as many as
    ``sampler_state`` has drawn)."""
    sampler = PromptSampler(sampler_state["n_prompts"], sampler_state["seed"])
    if n is None:
        n = sampler_state["epoch"] * sampler_state["n_prompts"] + sampler_state["position"]
    return sampler.next(n)


@pytest.mark.slow
def test_killed_generator_fails_the_run(tmp_path, policy):
    """`scalectl run` of a pipeline recipe spawns a generator and a trainer process that stream
    with in-flight updates and never train on a token more than k versions old; SIGKILL on the
    generator fails the run with a message naming it, and leaves no process behind."""
    # a budget never reached: the generator is killed mid-run however fast the machine
    proc, run_dir, tasks = _launch(tmp_path, policy, "pipe", "--set", "budget.steps=1000000")
    gen = next(t for t in tasks if t["role"] == "generator")
    # the step-3 point is evaluated in the background and may land after the step-3 checkpoint
    # (a run failed before it lands evaluates step 3 again on resume): kill once it is stored
    _wait(lambda: 3 in _stored_steps(tmp_path / "s.db"), what="the step-3 point")
    shown = _kill_and_show(proc, gen["pid"], tmp_path / "s.db")
    row = shown["run"]
    assert (f"ProcessFailed: pipeline generator process (rank 0, pid {gen['pid']}) was killed by signal SIGKILL"
            in row["error"]), row["error"]
    assert not any(pid_alive(t["pid"]) for t in tasks)             # no orphan
    steps = _steps(run_dir)
    assert len(steps) >= 3
    assert max(s["staleness_max"] for s in steps) <= K
    assert any(s["multi_version_share"] > 0 for s in steps)          # in-flight updates happened
    assert all(0 <= s["trainer_idle_share"] <= 1 for s in steps)
    points = shown["points"]
    assert [p["step"] for p in points][:2] == [0, 3]
    assert all(p["samples"] == p["step"] * P * G for p in points)    # P groups of G consumed per step


@pytest.mark.slow
@pytest.mark.parametrize("layout", [[], ["--set", "hardware.generators=2", "--set", "hardware.trainers=2",
                                         "--set", "filter.zero_variance=false"]],
                         ids=["1+1", "2+2"])
def test_interrupted_run_checkpoints_and_resumes(tmp_path, policy, layout):
    """SIGINT (Ctrl-C, `scalectl cancel`) drains the pipeline: the trainer checkpoints (every trainer
    rank its part), the run is cancelled, no process is left; `run --resume` finishes it (every
    trainer rank restoring the checkpoint) with evaluation steps 0, 3, 6, 9 once each and exactly
    P x G samples per step."""
    proc, run_dir, tasks = _launch(tmp_path, policy, "pipe", *layout)
    assert [t["role"] for t in tasks] == (["generator"] * 2 + ["trainer"] * 2 if layout else ["generator", "trainer"])
    try:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    db = tmp_path / "s.db"
    row = json.loads(run_cli("show", "pipe", "--json", db=db, check=True).stdout)["run"]
    assert row["status"] == "cancelled" and proc.returncode == 130
    assert not any(pid_alive(t["pid"]) for t in tasks)
    stopped_at = int((run_dir / "checkpoints" / "latest").read_text().split("-")[1])
    assert stopped_at >= 3
    # The checkpoint holds the prompts requested and not consumed, which the resumed run requests
    # first.  No prompt is retired (this untrained model solves none), so prompts are requested in
    # the sampler's plain order and each step consumed P of them: the saved requests are the ones
    # drawn after the first stopped_at * P, up to the sampler's position, however far the
    # generators had run ahead when the signal came.
    saved = _checkpoint(run_dir, stopped_at)
    assert saved["history"]["retired"] == []
    order = _prompt_order(saved["sampler"])
    assert 0 < len(saved["requests"]) <= (K + 1) * P
    assert saved["requests"] == order[stopped_at * P:]

    resumed = run_cli("run", "--resume", "pipe", "--runs-dir", str(tmp_path / "runs"), db=db, check=True,
                      timeout=240)
    if layout:       # the second trainer rank restored the checkpoint and followed the remaining steps
        assert f"trainer rank 1 followed {9 - stopped_at} step(s)" in resumed.stderr, resumed.stderr
    shown = json.loads(run_cli("show", "pipe", "--json", db=db, check=True).stdout)
    assert shown["run"]["status"] == "completed"
    assert [p["step"] for p in shown["points"]] == [0, 3, 6, 9]
    assert [p["samples"] for p in shown["points"]] == [s * P * G for s in (0, 3, 6, 9)]
    steps = _steps(run_dir)
    assert steps[-1]["step"] == 9 and max(s["staleness_max"] for s in steps) <= K
    # interrupted and resumed, the run consumed the first 9 * P prompts of the sampler's order
    # once each, as an uninterrupted run does: nothing counted twice in the history, nothing skipped
    final = _checkpoint(run_dir, 9)
    seen = Counter({int(p): len(h) for p, h in final["history"]["history"].items()})
    assert seen == Counter(_prompt_order(final["sampler"], 9 * P))


@pytest.mark.slow
def test_tasks_of_a_multi_task_job_run_their_roles(tmp_path, policy):
    """Two tasks started with the environment a job launcher gives them (RANK, WORLD_SIZE,
    MASTER_ADDR/PORT), each calling `run_job` on the run folder: rank 0 generates and leaves the
    run's status alone, rank 1 trains and records it."""
    import sys

    from scalectl.job.body import write_job_file
    from scalectl.rl.transport.roles import local_task_env
    from scalectl.recipe.load import load
    from scalectl.store.database import Store

    root = Path(__file__).resolve().parents[1]
    overrides = [a for a in TINY if a != "--set"] + [f"model.path={policy}", "budget.steps=3"]
    recipe = load(root / "recipes/magistral.toml", root / "setups/tiny-cpu.toml", overrides)
    with Store.open(tmp_path / "s.db") as store:
        run_id = store.create_run("tasks", recipe=recipe.to_dict(), recipe_hash=recipe.content_hash, seed=0,
                                  launcher="slurm", hardware="cpu", run_dir=str(tmp_path / "run"))
    write_job_file(tmp_path / "run", db=str(tmp_path / "s.db"), run_id=run_id, recipe=recipe.to_dict())
    port = free_port()
    code = f"from scalectl.job.body import run_job; print('RESULT', run_job({str(tmp_path / 'run')!r}))"
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **local_task_env(rank, 2, port)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "RESULT None" in outs[0] and "RESULT {'steps': 3" in outs[1]
    with Store.open(tmp_path / "s.db") as store:
        assert store.get_run("tasks")["status"] == "completed"
        assert [p["step"] for p in store.points(run_id)] == [0, 3]


# --------------------------------------------------------------------------- sync and ppo_off_policy in processes


def _run_rounds(tmp_path, policy, name, *extra, timeout=300):
    """`scalectl run` of scalerl on 2 generator + 2 trainer processes (zero-variance groups kept,
    so that every step trains even though the untrained policy solves nothing)."""
    db = tmp_path / "s.db"
    proc = run_cli("run", "recipes/scalerl.toml", "--name", name, "--runs-dir", str(tmp_path / "runs"),
                   "--set", f"model.path={policy}", *TINY, "--set", "hardware.generators=2",
                   "--set", "hardware.trainers=2", "--set", "filter.zero_variance=false", *extra,
                   db=db, check=True, timeout=timeout)
    return proc, tmp_path / "runs" / name, json.loads(run_cli("show", name, "--json", db=db, check=True).stdout)


@pytest.mark.slow   # 10-25 s: make test-slow (the default suite keeps under 10 minutes)
def test_sync_on_two_generators_and_two_trainers_is_on_policy(tmp_path, policy):
    """sync on 2 generators + 2 data-parallel trainers runs as the pipeline's 4 processes; every
    token each step trains was sampled by the weights of the trainer version that trains it
    (staleness 0, one version per completion), every step trains on its P groups over both trainer
    ranks, and the points land once per evaluation step, with P x G samples per step."""
    proc, run_dir, shown = _run_rounds(tmp_path, policy, "sync22", "--set", "async.mode=sync",
                                       "--set", "budget.steps=6")
    tasks = json.loads((run_dir / "pipeline" / "tasks.json").read_text())["tasks"]
    assert [t["role"] for t in tasks] == ["generator", "generator", "trainer", "trainer"]
    assert "2 generator process(es) and 2 trainer process(es) started (sync;" in proc.stderr
    assert "trainer rank 1 followed 6 step(s)" in proc.stderr
    steps = _steps(run_dir)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert all(s["groups_kept"] == P and not s.get("skipped") for s in steps)
    assert [(s["staleness_max"], s["staleness_mean"], s["multi_version_share"]) for s in steps] == [(0, 0.0, 0.0)] * 6
    assert all(s["tokens_per_s"] > 0 for s in steps)              # the staleness is over trained tokens
    assert shown["run"]["status"] == "completed"
    assert [p["step"] for p in shown["points"]] == [0, 3, 6]
    assert [p["samples"] for p in shown["points"]] == [0, 3 * P * G, 6 * P * G]


@pytest.mark.slow
def test_ppo_off_policy_in_processes_is_k_minus_1_stale_and_resumes_inside_a_round(tmp_path, policy):
    """ppo_off_policy-3 on 2 generators + 2 trainers: a round of 3 P prompts is sampled by one
    version and trained by the next 3 versions, so the steps' staleness is 0, 1, 2, 0, 1, 2.  A
    run stopped after step 4 (inside the second round) checkpoints the round's last batch; extended
    to 6 steps it trains steps 5 and 6 on that batch exactly as the uninterrupted run does (same
    loss, same staleness), with every trainer rank restoring its part."""
    ppo = ["--set", "async.mode=ppo_off_policy", "--set", "async.k=3"]
    _, plain_dir, plain = _run_rounds(tmp_path, policy, "plain", *ppo, "--set", "budget.steps=6")
    _, cut_dir, _ = _run_rounds(tmp_path, policy, "cut", *ppo, "--set", "budget.steps=4")
    assert len(_checkpoint(cut_dir, 4)["pending"]) == 2      # the round's batches for steps 5 and 6
    resumed = run_cli("run", "--resume", "cut", "--runs-dir", str(tmp_path / "runs"), "--set", "budget.steps=6",
                      db=tmp_path / "s.db", check=True, timeout=300)
    assert "trainer rank 1 followed 2 step(s)" in resumed.stderr, resumed.stderr
    ref, got = _steps(plain_dir), _steps(cut_dir)
    assert [s["staleness_max"] for s in ref] == [0, 1, 2, 0, 1, 2] == [s["staleness_max"] for s in got]
    assert all(s["multi_version_share"] == 0 for s in ref + got)
    for a, b in zip(ref[4:], got[4:]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6, abs=1e-9)
        assert b["reward"] == a["reward"] and b["groups_kept"] == a["groups_kept"] == P
    assert [p["samples"] for p in plain["points"]] == [0, 3 * P * G, 6 * P * G]


#: Seed-to-seed sd of the held-out pass rate after 40 sync steps of minimax on the tiny setup, beyond
#: the evaluation's own sampling: measured on 1 generator + 1 trainer, seeds 0-5 (`scalectl run
#: recipes/minimax.toml --seed S --set async.mode=sync --set budget.steps=40 --set eval.every_steps=20`):
#: pass rates at step 40 of 0.4255, 0.4350, 0.4228, 0.4283, 0.4158, 0.4280 (sd s = SEED_SD_TOTAL), each
#: with the binomial standard error EVAL_SE_MEASURED of its evaluation (500 prompts x 8 samples,
#: `evaluation_standard_error`); the training's own part is sqrt(s^2 - EVAL_SE_MEASURED^2) = 0.0029.
#: (Three seeds of 2 + 2 gave 0.4208, 0.4348, 0.4293: mean 0.4283 against 0.4259, sd 0.0071.)
SEED_SD_TOTAL, EVAL_SE_MEASURED = 0.0064, 0.0057
TRAIN_SD = max(SEED_SD_TOTAL ** 2 - EVAL_SE_MEASURED ** 2, 0.0) ** 0.5


@pytest.mark.slow
def test_sync_on_two_generators_and_two_trainers_learns_as_one_process_does(tmp_path):
    """sync on 2 generators + 2 trainers reaches the held-out pass rate of the one-process run
    (1 + 1) after the same 40 steps, within noise.  Noise: the two step-40 evaluations' binomial
    standard errors from their stored per-prompt correct counts, plus twice the training's
    seed-to-seed variance (the two layouts draw different samples: two seeds of one recipe),
    TRAIN_SD; tolerance 3 sd of the difference.  The test has the power to fail: the one-process
    run climbs by more than the tolerance, so a 2 + 2 run that learned nothing would not pass."""
    from scalectl.curve.fit import evaluation_standard_error

    db = tmp_path / "s.db"
    common = ["recipes/minimax.toml", "--runs-dir", str(tmp_path / "runs"), "--set", "async.mode=sync",
              "--set", "budget.steps=40", "--set", "eval.every_steps=40", "--set", "hardware.threads=1"]
    run_cli("run", *common, "--name", "one", db=db, check=True, timeout=1800)
    run_cli("run", *common, "--name", "four", "--set", "hardware.generators=2", "--set", "hardware.trainers=2",
            db=db, check=True, timeout=1800)
    points = {name: json.loads(run_cli("show", name, "--json", db=db, check=True).stdout)["points"]
              for name in ("one", "four")}
    assert [p["step"] for p in points["one"]] == [p["step"] for p in points["four"]] == [0, 40]
    # the same warm start evaluated with the same seed: the same correct counts, prompt by prompt
    assert points["one"][0]["correct_counts"] == points["four"][0]["correct_counts"]
    assert all(s["staleness_max"] == 0 for s in _steps(tmp_path / "runs" / "four"))
    k = 8                                                  # eval.samples_per_prompt of the tiny setup
    r0 = points["one"][0]["pass_rate"]
    r1, r4 = points["one"][1]["pass_rate"], points["four"][1]["pass_rate"]
    se1, se4 = (evaluation_standard_error(points[n][1]["correct_counts"], k) for n in ("one", "four"))
    tol = 3 * (se1 ** 2 + se4 ** 2 + 2 * TRAIN_SD ** 2) ** 0.5
    print(f"\npass rate at step 0 {r0:.4f}; at step 40: 1 + 1 {r1:.4f} (se {se1:.4f}), 2 + 2 {r4:.4f} "
          f"(se {se4:.4f}); difference {r4 - r1:+.4f}, tolerance {tol:.4f}")
    assert r1 - r0 > tol                                   # training moved the pass rate by more than the noise
    assert abs(r4 - r1) <= tol


@pytest.mark.slow   # three processes and a 15 s limit: test_board.py checks the watch in the default suite
def test_a_generator_that_stops_sending_while_alive_fails_the_run_naming_it(tmp_path, policy):
    """Generator 0 of 2 stops its loop after its second message of groups, its process and
    heartbeat alive (``SCALECTL_TEST_STALL_GENERATOR``: what a deadlocked engine looks like to
    the trainer).  Before, the trainer waited for its rollouts without bound; now, after
    ``launcher.stall_timeout_s`` without progress, the run is stored failed naming that task
    (role, rank, pid, host, log), and no process of the job is left."""
    import socket

    from scalectl.rl.processes.bodies import STALL_ENV

    db, runs, name = tmp_path / "s.db", tmp_path / "runs", "stuck"
    env = dict(os.environ, SCALECTL_DB=str(db), COLUMNS="200", **{STALL_ENV: "0:2"})
    args = ["run", "recipes/scalerl.toml", "--name", name, "--runs-dir", str(runs), "--set", f"model.path={policy}",
            *TINY, "--set", "budget.steps=1000000", "--set", "hardware.generators=2",
            "--set", "launcher.stall_timeout_s=15", "--set", "filter.zero_variance=false"]
    proc = subprocess.Popen([SCALECTL, *args], cwd=Path(__file__).resolve().parents[1], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, (out, err)
    tasks = json.loads((runs / name / "pipeline" / "tasks.json").read_text())["tasks"]
    stuck = tasks[0]
    assert f"{STALL_ENV}: generator rank 0 stops its loop after 2 message(s)" in err      # its log, relayed
    row = json.loads(run_cli("show", name, "--json", db=db, check=True).stdout)["run"]
    assert row["status"] == "failed"
    assert (f"TaskStuck: generator task 0 (generator rank 0, pid {stuck['pid']} on {socket.gethostname()}) made "
            f"no progress for " in row["error"]), row["error"]
    assert f"while its heartbeat went on (limit 15 s, launcher.stall_timeout_s) (log: {stuck['log']})" in row["error"]
    assert not any(pid_alive(t["pid"]) for t in tasks)             # no orphan, the stuck one included


@pytest.mark.slow
@pytest.mark.parametrize("rank", [2, 3], ids=["first-trainer-rank", "second-trainer-rank"])
def test_a_stopped_trainer_rank_fails_the_run_naming_it(tmp_path, policy, rank):
    """2 generators + 2 trainers; once the step-3 checkpoint is saved, trainer task ``rank`` is
    stopped (``kill -STOP``: its process and heartbeat frozen, its connections open).  The first
    trainer rank stopped holds the generators' sends; the second holds the first one inside the
    next step's collectives, where nothing of the first one looks at it.  Either way a generator,
    watching every trainer rank's heartbeat, finds it still for ``launcher.stall_timeout_s``: the
    run is stored failed naming that task (role, rank, pid, host, log) and what was seen, and no
    process of the job is left (the stopped one killed)."""
    import socket

    proc, run_dir, tasks = _launch(tmp_path, policy, "pipe", "--set", "budget.steps=1000000",
                                   "--set", "hardware.generators=2", "--set", "hardware.trainers=2",
                                   "--set", "filter.zero_variance=false", "--set", "launcher.stall_timeout_s=15")
    stopped = tasks[rank]
    assert stopped["role"] == "trainer"
    try:
        os.kill(stopped["pid"], signal.SIGSTOP)
        proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    row = json.loads(run_cli("show", "pipe", "--json", db=tmp_path / "s.db", check=True).stdout)["run"]
    assert row["status"] == "failed"
    named = (f"TaskLost: trainer task {rank} (trainer rank {rank - 2}, pid {stopped['pid']} on "
             f"{socket.gethostname()}) stopped answering (its heartbeat stood still for ")
    assert named in row["error"], row["error"]
    assert ("limit 15 s, launcher.stall_timeout_s: its process is stopped or its node cut off) "
            f"(log: {stopped['log']})") in row["error"], row["error"]
    assert not any(pid_alive(t["pid"]) for t in tasks)             # no orphan, the stopped one included
