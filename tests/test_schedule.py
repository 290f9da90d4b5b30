"""The async modes: one torch-free description per ``async.mode`` (its staleness bound, rounds,
request window, layouts), the schedules that serve it, and the staleness check of every batch
source."""

from __future__ import annotations

import ast
import dataclasses
import json
import pickle
import subprocess
import sys
import typing

import pytest

from conftest import ROOT
from scalectl.errors import UserError
from scalectl.recipe.async_modes import ASYNC_MODE_NAMES, ASYNC_MODES, PIPELINE_SCHEDULES, async_mode
from scalectl.recipe.schema import Async
from scalectl.rl.schedule.modes import SOURCES, schedule_for

LAYOUTS = [(1, 1), (2, 1), (1, 2), (64, 16)]     # (generators, trainers)
P = 48                                           # prompts per step


def test_the_schema_allows_every_mode_of_the_table_and_no_other():
    assert typing.get_args(Async.model_fields["mode"].annotation) == ASYNC_MODE_NAMES == (
        "sync", "ppo_off_policy", "pipeline")
    assert {cls.source for cls in ASYNC_MODES.values() if isinstance(cls.source, str)} <= set(SOURCES)
    assert {async_mode(Async(mode="pipeline", schedule=s)).source for s in PIPELINE_SCHEDULES} <= set(SOURCES)
    assert typing.get_args(Async.model_fields["schedule"].annotation) == PIPELINE_SCHEDULES == (
        "streaming", "fixed_lag")


def test_the_fixed_lag_schedule_is_the_pipelines_alone_and_runs_in_one_process():
    """``async.schedule = fixed_lag`` with another mode, or on a layout of processes, is refused
    naming the keys; at its default a recipe keeps the content hash it had before the key existed."""
    from pydantic import ValidationError

    from scalectl.recipe.load import load

    with pytest.raises(ValidationError, match=r"async.schedule = 'fixed_lag' applies to async.mode = 'pipeline' "
                                              r"only, not 'sync'; allowed with 'sync': streaming"):
        Async(mode="sync", schedule="fixed_lag")
    m = async_mode(Async(mode="pipeline", k=8, schedule="fixed_lag"))
    assert m.layout_problems(1, 1, P) == []
    assert m.layout_problems(2, 1, P) == [
        "async.schedule = fixed_lag samples and trains in one process: it needs hardware.generators = 1 and "
        "hardware.trainers = 1, not 2 and 1 (use async.schedule = streaming for this layout)"]
    setup = ROOT / "setups" / "tiny-cpu.toml"
    plain = load(ROOT / "recipes" / "scalerl.toml", setup, [])
    assert load(ROOT / "recipes" / "scalerl.toml", setup, ["async.schedule=streaming"]).content_hash == \
        plain.content_hash == "c33f6230083a"          # scalerl on tiny-cpu (setup of 2026-12-07), streaming at its default
    assert load(ROOT / "recipes" / "scalerl.toml", setup, ["async.schedule=fixed_lag"]).content_hash != \
        plain.content_hash


def test_the_dry_run_says_a_one_process_run_broadcasts_no_weights():
    from scalectl.job.layout import check_layout
    from scalectl.recipe.load import load

    setup = ROOT / "setups" / "tiny-cpu.toml"
    for overrides, broadcast in ((["async.schedule=fixed_lag"], False), (["async.mode=sync"], False), ([], True)):
        recipe = load(ROOT / "recipes" / "scalerl.toml", setup, overrides)
        (line,) = [ln for ln in check_layout(recipe, 1_000_000).lines if ln.startswith("weight sync:")]
        assert ("per update from trainer 0" in line) is broadcast and ("no broadcast" in line) is not broadcast


@pytest.mark.parametrize("mode, k, bound, steps, round_, window, processes, word", [
    # k is ignored by sync: one batch per weights, P prompts a round
    ("sync", 8, 0, 1, P, P, [False, True, True, True], "sync"),
    # k batches per weights: batch j trained j versions later; a round of k P prompts
    ("ppo_off_policy", 8, 7, 8, 8 * P, 8 * P, [False, True, True, True], "ppo_off_policy-8"),
    # a stream: no rounds, (k + 1) P requests kept open, always in processes
    ("pipeline", 8, 8, None, None, 9 * P, [True, True, True, True], "pipeline-8"),
    ("pipeline", 1, 1, None, None, 2 * P, [True, True, True, True], "pipeline-1"),
    # the fixed-lag pipeline: in one process on 1 + 1 (other layouts are refused: see below)
    ("pipeline fixed_lag", 3, 3, None, None, 4 * P, [False, True, True, True], "pipeline-3 (fixed lag)"),
])
def test_each_mode_declares_its_bound_rounds_window_and_processes(mode, k, bound, steps, round_, window,
                                                                  processes, word):
    mode, *schedule = mode.split()
    m = async_mode(Async(mode=mode, k=k, schedule=schedule[0] if schedule else "streaming"))
    assert (m.name, m.staleness_bound, m.steps_per_round, m.round_prompts(P), m.request_window(P),
            [m.in_processes(g, t) for g, t in LAYOUTS], m.describe()) == (
        mode, bound, steps, round_, window, processes, word)
    s = schedule_for(Async(mode=mode, k=k, **({"schedule": schedule[0]} if schedule else {})))
    assert s.mode == m and [s.in_processes(g, t) for g, t in LAYOUTS] == processes and s.describe() == word


def test_modes_are_frozen_and_travel_to_processes():
    m = async_mode(Async(mode="ppo_off_policy", k=4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.k = 5
    s = schedule_for(Async(mode="pipeline", k=2))
    assert pickle.loads(pickle.dumps(s)) == s       # a ProcessSpec carries the job's schedule


@pytest.mark.parametrize("mode, k, prompts, gens, trains, problem", [
    ("sync", 1, 16, 3, 1, "batch.prompts_per_step = 16 does not split into whole groups across "
     "hardware.generators = 3 in async.mode = sync: 2 generator(s) would wait while the others sample the last "
     "prompts of each round (use a number of generators that divides 16)"),
    ("ppo_off_policy", 3, 48, 40, 16, "a round of async.k x batch.prompts_per_step = 3 x 48 = 144 prompts does not "
     "split into whole groups across hardware.generators = 40 in async.mode = ppo_off_policy: 16 generator(s) "
     "would wait"),
    ("pipeline", 1, 8, 20, 1, "async.mode = pipeline keeps (async.k + 1) x batch.prompts_per_step = (1 + 1) x 8 = "
     "16 prompts requested at once: hardware.generators = 20 would leave 4 generator(s) without work "
     "(use at most 16)"),
])
def test_each_mode_names_the_layouts_it_refuses(mode, k, prompts, gens, trains, problem):
    m = async_mode(Async(mode=mode, k=k))
    problems = m.layout_problems(gens, trains, prompts)
    assert len(problems) == 1 and problems[0].startswith(problem)
    # what it accepts: a divisor of the round, or a stream with a request per generator
    ok = {"sync": 16, "ppo_off_policy": 48, "pipeline": 16}[mode]
    assert m.layout_problems(ok, trains, prompts) == []


def test_a_round_mode_in_one_process_has_no_generators_to_idle():
    assert async_mode(Async(mode="ppo_off_policy", k=3)).layout_problems(1, 1, 7) == []


def test_unknown_mode_names_the_known_ones():
    with pytest.raises(UserError, match="async.mode = 'later' is not one of: sync, ppo_off_policy, pipeline"):
        schedule_for(Async.model_construct(mode="later", k=1))


def test_the_modes_and_the_dry_run_import_neither_torch_nor_the_launchers():
    code = ("import json, sys; import scalectl.recipe.async_modes, scalectl.recipe.schema, scalectl.job.layout; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'deepspeed', 'transformers', 'vllm') or m.startswith(('scalectl.launch', 'scalectl.rl.schedule')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def _name(call: ast.Call) -> str | None:
    return call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)


def test_one_schedule_is_built_per_job():
    """``schedule_for`` is called once in the package, by the job body, which passes the schedule
    down; the dry run builds the mode's description for itself."""
    src = ROOT / "src"
    calls = sorted((path.relative_to(src).as_posix(), _name(node)) for path in (src / "scalectl").rglob("*.py")
                   for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Call) and _name(node) in ("schedule_for", "async_mode"))
    assert [c for c in calls if c[1] == "schedule_for"] == [("scalectl/job/body.py", "schedule_for")]
    # the mode's torch-free description: built by the dry run's layout checks and by the schedule itself
    assert {path for path, name in calls if name == "async_mode"} == {"scalectl/job/layout.py",
                                                                      "scalectl/rl/schedule/modes.py"}


# --------------------------------------------------------------------------- the staleness check


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A one-process ppo_off_policy-2 run's pieces (bound 1): a tiny model's CPU engine, its loop
    state and 12 training prompts; every group kept (no filter), so every batch has tokens."""
    from scalectl.recipe.load import load
    from scalectl.rl.data.arithmetic import make_splits
    from scalectl.rl.loop import Policy, new_state
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer
    from scalectl.rl.rollout import make_engine

    recipe = load(ROOT / "recipes" / "grpo.toml", ROOT / "setups" / "tiny-cpu.toml", [
        "async.mode=ppo_off_policy", "async.k=2", "batch.prompts_per_step=2", "batch.generations_per_prompt=2",
        "length.max_new_tokens=4", "filter.zero_variance=false", "filter.retire_solved=false"])
    model, tok = build_tiny_model(seed=0, num_hidden_layers=2, hidden_size=64, intermediate_size=128), build_tokenizer()
    policy = Policy(model, tok, make_engine(recipe, model, tok), trainer=None, n_params=0)
    train, _ = make_splits(12, 4, seed=0, difficulty=2)
    return recipe, policy, train, new_state


def _versions(groups) -> set[int]:
    return {v for g in groups for c in g.completions for v in c.versions}


def test_local_batches_refuse_a_batch_older_than_the_bound(local):
    """A round sampled by version 0 trains versions 0 and 1 (lags 0 and 1 <= bound 1); its second
    batch reaching version 2 (lag 2) is refused, naming the versions."""
    from scalectl.rl.batches.collect import StalenessError

    recipe, policy, train, new_state = local
    schedule = schedule_for(recipe.async_)
    assert schedule.mode.staleness_bound == 1

    state = new_state(recipe, 0, len(train))
    policy.engine.update_weights(None, 0)
    source = schedule.batches(recipe, policy, state, train)
    first, _ = source.next_batch(0)                  # generates the round of 2 batches with version 0
    assert _versions(first) == {0} and len(state.pending) == 1
    second, _ = source.next_batch(1)                 # one version behind: allowed
    assert _versions(second) == {0} and state.pending == []

    state = new_state(recipe, 0, len(train))
    source = schedule.batches(recipe, policy, state, train)
    source.next_batch(0)
    with pytest.raises(StalenessError, match=r"a trained token has version 0, 2 versions behind trainer version 2 "
                                             r"\(async\.mode = ppo_off_policy-2 allows at most 1\)"):
        source.next_batch(2)


def test_the_fixed_lag_pipeline_trains_each_batch_exactly_k_versions_after_it_was_sampled(local):
    """With k = 2, the batch of step v is sampled whole by version max(0, v - 2): batches 0-2 by
    version 0 at the first step, then one batch per step by the weights that step starts with;
    k + 1 batches are kept ahead, and the step's staleness metrics say the lag."""
    recipe, policy, train, new_state = local
    from scalectl.recipe.load import load
    recipe = load(ROOT / "recipes" / "grpo.toml", ROOT / "setups" / "tiny-cpu.toml", [
        "async.mode=pipeline", "async.k=2", "async.schedule=fixed_lag", "batch.prompts_per_step=2",
        "batch.generations_per_prompt=2", "length.max_new_tokens=4", "filter.zero_variance=false",
        "filter.retire_solved=false"])
    schedule = schedule_for(recipe.async_)
    assert not schedule.in_processes(1, 1) and schedule.mode.source == "lagged"
    state = new_state(recipe, 0, len(train))
    policy.engine.update_weights(None, 0)
    source = schedule.batches(recipe, policy, state, train)
    seen = []
    for v in range(6):
        batch, _ = source.next_batch(v)
        assert len(state.pending) == 2                   # k batches left ahead after the pop
        seen.append(_versions(batch))
        state.step = v + 1                               # the step is taken: version v + 1
        policy.engine.update_weights(None, v + 1)
        assert source.step_metrics(v + 1) == {"staleness_max": min(v, 2), "staleness_mean": float(min(v, 2))}
    assert seen == [{0}, {0}, {0}, {1}, {2}, {3}]
    with pytest.raises(ValueError, match="fixed_lag samples in the trainer's own process"):
        schedule.batches(recipe, policy, state, train, link=object())
