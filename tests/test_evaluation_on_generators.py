"""Held-out evaluation sampled by the generator processes (``hardware.evaluation``): the chunks and
their seeds, the hold on the evaluated version, and whole runs on CPU in which the trainer
processes hold no rollout engine and every point's completions come from the one version it names."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from conftest import ROOT, run_cli
from scalectl.rl.evaluation.pass_rate import CHUNK_PROMPTS, combine_chunks, evaluate
from scalectl.rl.evaluation.shares import EvaluationVersionError, PointParts, assign_chunks, chunk_size, evaluate_share
from scalectl.rl.policy.model import build_tiny_model, build_tokenizer
from scalectl.rl.reward.scoring import Scorer
from scalectl.rl.rollout.cpu import CPURolloutEngine
from scalectl.rl.rollout.sampling import SamplingParams
from scalectl.rl.transport.roles import Task, free_port
from scalectl.rl.transport.stream import (Channel, WeightSlot, end_weights, header_value, push_weights, read_header,
                                          weight_layout, weight_seats)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _problems(n: int):
    from scalectl.rl.data.arithmetic import eval_problems

    return eval_problems(n, seed=5, difficulty=2)


def test_chunks_cover_the_prompts_and_give_every_generator_work():
    assert CHUNK_PROMPTS == 512
    assert chunk_size(1000, 64) == 16 and chunk_size(1000, 1) == 512 and chunk_size(1024, 2) == 512
    assert chunk_size(1000, 1, 64) == 64 and chunk_size(128, 2, 64) == 64
    assert chunk_size(10, 4) == 3 and chunk_size(1, 8) == 1
    assert chunk_size(500, 2) == 256 and chunk_size(500, 3) == 192     # whole random streams of 64 prompts
    shares = assign_chunks(1000, list(range(64)))
    chunks = sorted((c for cs in shares.values() for c in cs), key=lambda c: c.start)
    assert [i for c in chunks for i in c] == list(range(1000))
    assert all(len(cs) in (0, 1) for cs in shares.values()) and sum(map(len, shares.values())) == 63
    assert {g: [(c.start, c.stop) for c in cs] for g, cs in assign_chunks(10, [3, 7]).items()} == {
        3: [(0, 5)], 7: [(5, 10)]}


def test_shares_on_several_engines_give_the_evaluation_of_one(tok, one_torch_thread):
    """With as many held-out prompts per generator as one engine's calls take (64 here, to keep
    the test small; 512 by default), two generators' shares (each chunk sampled with seed + its
    first prompt) combine into exactly what one engine's evaluation gives, with every completion
    tagged by the engine's version."""
    problems = _problems(128)
    params = SamplingParams(max_new_tokens=8)
    engine = CPURolloutEngine(build_tiny_model(seed=0), tok, version=7)
    whole = evaluate(engine, problems, params, samples_per_prompt=2, seed=11, score=Scorer(), chunk_prompts=64)
    parts = []
    for g, chunks in assign_chunks(len(problems), [0, 1], chunk_prompts=64).items():
        mine = evaluate_share(engine, problems, chunks, params, samples_per_prompt=2, seed=11, score=Scorer())
        assert len(mine) == 1 and all(v == [7] for p in mine for v in p["versions"])
        parts += mine
    assert combine_chunks(parts[::-1], 2) == whole
    assert len(whole["correct_counts"]) == 128 and 0 < whole["mean_length"] <= 8


def test_an_evaluation_in_calls_of_512_prompts_samples_what_calls_of_64_sample(tok, one_torch_thread):
    """The random streams (64 prompts each, seed + first prompt), not the engine calls, decide an
    evaluation's samples: 200 held-out prompts in one call or in calls of 64 give the same point."""
    problems = _problems(200)
    params = SamplingParams(max_new_tokens=8)
    engine = CPURolloutEngine(build_tiny_model(seed=0), tok)
    one_call = evaluate(engine, problems, params, samples_per_prompt=2, seed=5, score=Scorer())
    small_calls = evaluate(engine, problems, params, samples_per_prompt=2, seed=5, score=Scorer(), chunk_prompts=64)
    assert one_call == small_calls and len(one_call["correct_counts"]) == 200
    one_stream = evaluate(engine, problems, params, samples_per_prompt=2, seed=5, score=Scorer(), seed_prompts=None)
    assert one_stream["mean_length"] != one_call["mean_length"]           # one stream for the call samples otherwise


def test_point_parts_refuse_another_version_and_unasked_chunks():
    chunk = {"start": 0, "correct_counts": [1, 0], "truncated": 0, "length_sum": 9, "completions": 4,
             "versions": [[3], [3], [3], [2, 3]]}
    parts = PointParts(3, {0: 1})
    with pytest.raises(EvaluationVersionError, match=r"step 3: generator 0 .* version\(s\) \[2, 3\]"):
        parts.add(0, [chunk])
    with pytest.raises(ValueError, match="unexpected"):
        parts.add(1, [dict(chunk, versions=[[3]] * 4)])
    parts.add(0, [dict(chunk, versions=[[3]] * 4)])
    assert parts.complete and parts.result(2) == {"pass_rate": 0.25, "samples_per_prompt": 2,
                                                  "correct_counts": [1, 0], "truncation_rate": 0.0,
                                                  "mean_length": 2.25, "checker_errors": 0}
    counted = PointParts(4, {0: 1})
    counted.add(0, [dict(chunk, versions=[[4]] * 4, checker_errors=3)])   # a generator's count reaches the point
    assert counted.result(2)["checker_errors"] == 3
    assert parts.record() == [{"step": 3, "generator": 0, "start": 0, "prompts": 2, "versions": [[3]] * 4}]


def test_the_weights_header_carries_the_evaluate_bit():
    assert read_header(header_value(5)) == (5, False)
    assert read_header(header_value(5, evaluate=True)) == (5, True)
    assert read_header(header_value(-1, evaluate=True)) == (-1, False)
    assert header_value(5) == 5                          # an unflagged header is the version, as before
    with pytest.raises(ValueError):
        header_value(2**62)


def test_weight_seats_of_dedicated_and_tensor_parallel_generators():
    # 3 generators + a leader at rank 3; generator 2 evaluates alone; each engine has 2 workers
    seats = {r: weight_seats(r, 3, seats_per_generator=2, evaluator=2) for r in range(5)}
    assert {n: (s.first, s.count, s.size) for n, s in seats[0].items()} == {"weights": (0, 2, 5)}
    assert {n: (s.first, s.count, s.size) for n, s in seats[1].items()} == {"weights": (2, 2, 5)}
    assert {n: (s.first, s.count, s.size) for n, s in seats[2].items()} == {"eval_weights": (0, 2, 3)}
    assert {n: (s.first, s.count, s.size, s.leader) for n, s in seats[3].items()} == {
        "weights": (4, 1, 5, 4), "eval_weights": (2, 1, 3, 2)}
    assert seats[4] == {}                                 # a follower trainer rank pushes nothing
    assert weight_seats(0, 1) == {"weights": weight_seats(0, 1)["weights"]} and weight_seats(1, 1)["weights"].first == 1


def _channel_pair():
    port = free_port()
    tasks = [Task(role, r, 2, r, 0, 1, "127.0.0.1", port, "env") for r, role in enumerate(("generator", "trainer"))]
    out = [None, None]
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, Channel.connect(tasks[r], timeout_s=60)))
               for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_a_version_pushed_to_be_evaluated_is_held_until_released(tok):
    """A push with the evaluate bit is loaded and held: the next version arrives whole in the
    receive buffers meanwhile, but the engine keeps the evaluated weights until the hold is
    released (over a real gloo weights' group)."""
    gen, trainer = _channel_pair()
    engine = CPURolloutEngine(build_tiny_model(seed=0), tok)
    slot = WeightSlot(gen.groups["weights"], 1, engine, weight_layout(engine.model))
    m1, m2 = build_tiny_model(seed=1), build_tiny_model(seed=2)
    push_weights(trainer.groups["weights"], m1, 1, evaluate=True)
    assert slot.poll(wait=True) and (slot.hold, engine.version) == (1, 1)
    push_weights(trainer.groups["weights"], m2, 2)       # lands in the buffers: the generator had posted them
    for work in slot.receiver.works:                     # the sender is done; the receives complete after it
        work.wait()
    assert slot.receiver.ready()
    assert not slot.poll() and not slot.poll(wait=True) and engine.version == 1
    assert all(torch.equal(a, b) for a, b in zip(engine.model.state_dict().values(), m1.state_dict().values()))
    slot.release()
    assert slot.poll() and (slot.hold, engine.version) == (None, 2)
    assert all(torch.equal(a, b) for a, b in zip(engine.model.state_dict().values(), m2.state_dict().values()))
    end_weights(trainer.groups["weights"], weight_layout(m2))
    slot.drain()
    assert slot.ended


# --------------------------------------------------------------------------- runs in processes


P, G, EVERY, STEPS, HELD_OUT, K_EVAL = 8, 4, 2, 4, 128, 2
SETS = [f"batch.prompts_per_step={P}", f"batch.generations_per_prompt={G}", f"eval.prompts={HELD_OUT}",
        f"eval.samples_per_prompt={K_EVAL}", f"eval.every_steps={EVERY}", "checkpoint.every_steps=2",
        "async.k=1", "data.train_size=200", f"budget.steps={STEPS}", "filter.zero_variance=false",
        "hardware.threads=1"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    """A freshly initialised tiny policy (no warm start: these runs are about where evaluations sample)."""
    from scalectl.rl.policy.model import save_policy

    return str(save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("policy") / "tiny"))


def _run(tmp_path, policy, name, *sets):
    db = tmp_path / "s.db"
    args = [a for s in [*SETS, f"model.path={policy}", *sets] for a in ("--set", s)]
    # --new-run: runs differing only in where they evaluate (speed only) have one content hash and seed,
    # which `scalectl run` would otherwise reuse
    proc = run_cli("run", "recipes/scalerl.toml", "--name", name, "--runs-dir", str(tmp_path / "runs"), *args,
                   "--new-run", db=db, check=True, timeout=900)
    shown = json.loads(run_cli("show", name, "--json", db=db, check=True).stdout)
    return proc, tmp_path / "runs" / name, shown


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "evaluations.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_pipeline_evaluates_on_its_generators_each_point_from_its_version(tmp_path, policy):
    """A pipeline of 2 generator processes + 1 trainer process with hardware.evaluation =
    generators: the trainer builds no rollout engine; every evaluation point is sampled by the two
    generators, half of the held-out prompts each, while they keep training rollouts and taking
    the weights pushed after every step; each point's completions were all sampled by the weights
    of the version the point names (the record of token versions per evaluation completion)."""
    proc, run_dir, shown = _run(tmp_path, policy, "gens", "async.mode=pipeline", "hardware.generators=2",
                                "hardware.evaluation=generators")
    assert "trainer rank 0: no rollout engine (evaluation on the generators)" in proc.stderr
    points = shown["points"]
    assert [p["step"] for p in points] == [0, 2, 4]
    assert all(len(p["correct_counts"]) == HELD_OUT for p in points)
    records = _records(run_dir)
    for step in (0, 2, 4):
        mine = [r for r in records if r["step"] == step]
        assert sorted(r["generator"] for r in mine) == [0, 1]                  # both generators sampled
        assert sorted((r["start"], r["prompts"]) for r in mine) == [(0, 64), (64, 64)]
        versions = [v for r in mine for v in r["versions"]]
        assert len(versions) == HELD_OUT * K_EVAL and versions == [[step]] * len(versions)
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all(s["weights_push_s"] > 0 and s["staleness_max"] <= 1 for s in steps)


@pytest.mark.slow
def test_sync_points_on_the_generators_equal_the_trainers(tmp_path, policy):
    """sync on 2 generators + 1 trainer (deterministic: every batch is sampled by the weights of its
    step with fixed seeds): evaluated on the trainer or on the generators, the points are the same,
    prompt by prompt; on the generators the trainer holds no rollout engine."""
    common = ["async.mode=sync", "hardware.generators=2"]
    _, _, on_trainer = _run(tmp_path, policy, "trainer", *common, "hardware.evaluation=trainer")
    proc, run_dir, on_gens = _run(tmp_path, policy, "gens", *common, "hardware.evaluation=generators")
    assert "no rollout engine" in proc.stderr
    keys = ("step", "pass_rate", "correct_counts", "truncation_rate", "mean_length", "samples", "tokens")
    assert [{k: p[k] for k in keys} for p in on_gens["points"]] == [{k: p[k] for k in keys}
                                                                    for p in on_trainer["points"]]
    assert [p["step"] for p in on_gens["points"]] == [0, 2, 4]
    assert {r["generator"] for r in _records(run_dir)} == {0, 1}


@pytest.mark.slow
def test_a_dedicated_evaluation_generator_samples_every_point_and_no_rollout(tmp_path, policy):
    """hardware.evaluation = dedicated on 2 generators: generator 1 samples every evaluation (the
    versions of each point's completions are the point's) and generator 0 every training rollout."""
    proc, run_dir, shown = _run(tmp_path, policy, "ded", "async.mode=pipeline", "hardware.generators=2",
                                "hardware.evaluation=dedicated", "logging.rollouts=true")
    assert "no rollout engine" in proc.stderr
    assert [p["step"] for p in shown["points"]] == [0, 2, 4]
    records = _records(run_dir)
    assert {r["generator"] for r in records} == {1}
    for step in (0, 2, 4):
        versions = [v for r in records if r["step"] == step for v in r["versions"]]
        assert versions == [[step]] * (HELD_OUT * K_EVAL)
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == STEPS * P * G and {r["generator"] for r in rollouts} == {0}
