"""Reward functions by name (``[reward]``, docs/rewards.md): answer formats and their
instructions, the content hash, the scorer (the built-in checker, a function of the user's
in worker processes, several gold answers, the row's fields), clear errors naming the
function, partial credit into the advantages, and runs that call the function in every
process that scores (``tests/custom_rewards.py``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, run_cli
from custom_rewards import CALLS_ENV
from scalectl.errors import UserError
from scalectl.recipe.load import load
from scalectl.recipe.reward_function import ANSWER_FORMATS, BUILTIN_REWARD, import_function
from scalectl.recipe.schema import Recipe
from scalectl.rl.data.arithmetic import Problem
from scalectl.rl.data.files import load_problems, render_prompt
from scalectl.rl.reward.checker import check
from scalectl.rl.reward.formats import (GSM8K_INSTRUCTION, INSTRUCTIONS, LAST_LINE_INSTRUCTION, final_answer)
from scalectl.rl.reward.gold import Gold
from scalectl.rl.reward.score import RewardFunctionError, Score
from scalectl.rl.reward.scoring import Scorer, scorer_for
from scalectl.rl.rollout.base import Completion
from scalectl.rl.rollout.groups import score_groups

MATH = ROOT / "tests" / "data" / "math"
TESTS = str(ROOT / "tests")


@pytest.fixture(autouse=True)
def fresh_workers():
    """Worker processes keep the environment they started with ($SCALECTL_TEST_REWARD_CALLS):
    each test starts its own."""
    from scalectl.rl.reward.calls import close_workers

    close_workers()
    yield
    close_workers()


# --------------------------------------------------------------------------- formats


def test_the_schema_the_checker_and_the_prompts_know_the_same_formats():
    from typing import get_args

    from scalectl.recipe.schema import Reward

    assert get_args(Reward.model_fields["format"].annotation) == ANSWER_FORMATS == tuple(INSTRUCTIONS)
    assert Reward().function == BUILTIN_REWARD and import_function(BUILTIN_REWARD).__name__ == "score"


@pytest.mark.parametrize("text,fmt,answer", [
    ("so \\boxed{1} then \\boxed{\\frac{1}{2}}", "boxed", "\\frac{1}{2}"),
    ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18\n#### 18", "gsm8k", "18"),
    ("#### 7 #### 1,000\nThat is all.", "gsm8k", "1,000"),
    ("####\n", "gsm8k", None),
    ("3 + 4 is 7.\n\nAnswer: $7$.\n", "last_line", "7"),
    ("**Final answer:** x = 4", "last_line", "x = 4"),
    ("The answer is 12", "last_line", "12"),
    ("answers vary: 3", "last_line", "answers vary: 3"),       # "answer" is a prefix only as a word
    ("\n \n", "last_line", None),
    ("no box", "boxed", None),
])
def test_final_answers_in_each_format(text, fmt, answer):
    assert final_answer(text, fmt) == answer


def test_a_gsm8k_answer_scores_in_its_format_and_not_as_boxed():
    """The GSM8K-style ``#### 42`` completion scored -1 with the only format there was."""
    gsm8k = "Janet sells 16 - 3 - 4 = 9 eggs and makes 9 * 2 = $18.\n#### 18"
    assert check(gsm8k, "18", answer_format="gsm8k") and not check(gsm8k, "18")
    assert not check(gsm8k, "19", answer_format="gsm8k")
    assert check("I add them.\nThe answer is 1 000", "1000", answer_format="last_line")   # thousands, as boxed
    assert not check("\\boxed{18}", "18", answer_format="gsm8k")
    with pytest.raises(ValueError, match="reward.format = 'latex' is not one of: boxed, gsm8k, last_line"):
        check("x", "1", answer_format="latex")


def test_prompts_get_the_instruction_of_their_format_or_none(tmp_path):
    """GSM8K test rows: the boxed instruction by default, verl's #### instruction for gsm8k, none
    with ``reward.instruction = false``, and none twice; de-duplication does not see it."""
    messages = ({"role": "user", "content": "What is 2+2?"},)
    assert render_prompt(messages, answer_format="gsm8k") == "What is 2+2? " + GSM8K_INSTRUCTION
    assert render_prompt(messages, answer_format="last_line") == "What is 2+2? " + LAST_LINE_INSTRUCTION
    assert render_prompt(messages, answer_format="gsm8k", instruction=False) == "What is 2+2?"
    asked = ({"role": "user", "content": "What is 2+2? End with '#### N'."},)
    assert render_prompt(asked, answer_format="gsm8k") == asked[0]["content"]
    assert render_prompt(asked) == asked[0]["content"] + " " + INSTRUCTIONS["boxed"]
    source = str(MATH / "gsm8k-test.jsonl")
    results = {fmt: load_problems(source, held_out=10, train_size=20, answer_format=fmt)
               for fmt in ANSWER_FORMATS}
    bare, _, bare_info = load_problems(source, held_out=10, train_size=20, instruction=False)
    for fmt, (train, held, info) in results.items():
        assert info == bare_info                                 # the same rows kept, the same split
        assert [p.prompt for p in train] == [b.prompt + " " + INSTRUCTIONS[fmt] for b in bare]


# --------------------------------------------------------------------------- the hash


def test_the_reward_is_in_the_hash_by_name_and_version_and_defaults_keep_stored_hashes():
    base = "c33f6230083a"                    # scalerl on tiny-cpu (setup of 2026-12-07: reward.truncated = -1, the rest of [reward] at its defaults)
    at_defaults = load("scalerl", setup="tiny-cpu", overrides=[
        f"reward.function={BUILTIN_REWARD}", "reward.format=boxed", "reward.instruction=true", "reward.timeout_s=5.0"])
    assert load("scalerl", setup="tiny-cpu").content_hash == at_defaults.content_hash == base
    hashes = {s: load("scalerl", setup="tiny-cpu", overrides=[s]).content_hash for s in (
        "reward.function=custom_rewards:digit_share", "reward.format=gsm8k", "reward.version=v1",
        "reward.version=v2", "reward.instruction=false", "reward.timeout_s=30")}
    assert base not in hashes.values() and len(set(hashes.values())) == len(hashes)
    again = load("scalerl", setup="tiny-cpu", overrides=["reward.version=v2"])
    assert again.content_hash == hashes["reward.version=v2"]


@pytest.mark.parametrize("setting,message", [
    ("reward.function=mypkg.rewards", "reward.function: 'mypkg.rewards' does not name a function as "
                                      "'package.module:callable'"),
    ("reward.format=latex", "reward.format = 'latex' is not one of: boxed, gsm8k, last_line"),
    ("reward.timeout_s=0", "reward.timeout_s = 0 is out of range: must be > 0"),
    ("reward.functions=a:b", "reward.functions: unknown key; did you mean reward.function? The keys of [reward]:"),
])
def test_a_bad_reward_section_is_refused(setting, message):
    with pytest.raises(UserError) as err:
        load("scalerl", setup="tiny-cpu", overrides=[setting])
    assert message in str(err.value)


# --------------------------------------------------------------------------- importing


def test_validation_imports_the_function_and_refuses_what_would_not_work(tmp_path):
    def problems(*sets):
        with pytest.raises(UserError) as err:
            load("scalerl", setup="tiny-cpu", overrides=list(sets), check_files=True)
        return str(err.value)

    assert load("scalerl", setup="tiny-cpu", overrides=["reward.function=custom_rewards:digit_share"],
                check_files=True).reward.function == "custom_rewards:digit_share"
    assert ("reward.function = 'no_such_module_xyz:score' cannot be imported: ModuleNotFoundError: No module "
            "named 'no_such_module_xyz'") in problems("reward.function=no_such_module_xyz:score")
    assert "module 'custom_rewards'" in problems("reward.function=custom_rewards:nothing_here")
    assert "reward.function = 'custom_rewards:NOT_CALLABLE' is not a function (an object of type int)" in problems(
        "reward.function=custom_rewards:NOT_CALLABLE")
    two = problems("reward.function=custom_rewards:two_arguments")
    assert (f"reward.function = 'custom_rewards:two_arguments' (in {ROOT / 'tests' / 'custom_rewards.py'}) fits none "
            "of the three accepted shapes (scalectl: f(completion, gold, fields) or f(completion, gold, **fields)") in two
    assert "; verl: compute_score(data_source, solution_str, ground_truth, extra_info=None)" in two
    assert "; trl: reward_func(completions, **kwargs) over a batch" in two
    assert two.endswith("as scalectl calls it: too many positional arguments")
    assert "model.think_tags = true has no effect with reward.function = 'custom_rewards:digit_share'" in problems(
        "reward.function=custom_rewards:digit_share", "model.think_tags=true")
    assert "reward.format = 'gsm8k': model.path = 'builtin:tiny' is warm-started to answer in \\boxed{}" in problems(
        "reward.format=gsm8k")
    with pytest.raises(UserError, match="model.think_tags = true has no effect"):
        scorer_for(load("scalerl", setup="tiny-cpu", overrides=["reward.function=custom_rewards:digit_share",
                                                                 "model.think_tags=true"]))
    out = run_cli("validate", "recipes/scalerl.toml", "--setup", "setups/tiny-cpu.toml",
                  "--set", "reward.function=no_such_module_xyz:score")
    assert out.returncode == 2 and "reward.function = 'no_such_module_xyz:score' cannot be imported" in out.stderr


def test_a_module_in_the_current_folder_is_found(tmp_path, monkeypatch):
    """As ``python -m`` would: ``mymod.py`` beside the recipe, not installed, not on PYTHONPATH."""
    (tmp_path / "reward_beside_the_recipe.py").write_text("def score(c, g, f):\n    return 0.25\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert import_function("reward_beside_the_recipe:score")("x", "1", {}) == 0.25
        assert Scorer("reward_beside_the_recipe:score")("x", Problem(0, "1+0=", "1")) == Score(0.25, True)
    finally:
        sys.modules.pop("reward_beside_the_recipe", None)


# --------------------------------------------------------------------------- scoring


def _comps(texts):
    return [Completion(0, [1], [2], [-0.5], [0], "stop", t) for t in texts]


def test_partial_credit_flows_into_the_advantages(tmp_path, monkeypatch):
    """``half_for_a_box`` gives 1, 0.5, 0.5, -1: mean 0.25, deviations 0.75, 0.25, 0.25, -1.25,
    population std sqrt(2.25 / 4) = 0.75, so GRPO's advantages are 1, 1/3, 1/3, -5/3 (over
    0.75 + 1e-6); a float > 0 counts as correct."""
    from scalectl.rl.train.batch import build_train_batch

    calls = tmp_path / "calls"
    monkeypatch.setenv(CALLS_ENV, str(calls))
    recipe = Recipe.model_validate({"reward": {"function": "custom_rewards:half_for_a_box"}})
    problems = [Problem(0, "1+2=", "3")]
    [group] = score_groups([_comps(["\\boxed{3}", "\\boxed{4}", "4;\\boxed{5}", "no box"])], problems, [0],
                           recipe.length, scorer_for(recipe))
    assert group.rewards.tolist() == [1.0, 0.5, 0.5, -1.0] and group.correct == [True, True, True, False]
    a = [0.75, 0.25, 0.25, -1.25]
    for norm, scale in (("prompt", 0.75 + 1e-6), ("none", 1.0)):
        batch = build_train_batch([group], norm, pad_id=0)
        assert batch.advantages.tolist() == pytest.approx([x / scale for x in a], rel=1e-6)
    assert len(calls.read_text().splitlines()) == 4                      # one call per completion
    assert {line.split()[1] for line in calls.read_text().splitlines()} == {str(os.getpid())}


def test_several_gold_answers_call_the_function_for_each_and_the_best_counts(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv(CALLS_ENV, str(calls))
    problem = Problem(0, "x?", Gold(("4", "7")))
    score = Scorer("custom_rewards:half_for_a_box")
    assert score("\\boxed{7}", problem) == Score(1.0, True)           # 0.5 against 4, 1 against 7
    assert score("\\boxed{5}", problem) == Score(0.5, True)
    assert score("none", problem) == Score(-1.0, False)
    assert len(calls.read_text().splitlines()) == 6
    assert Scorer()("\\boxed{7}", problem) == Score(1.0, True) and Scorer()("\\boxed{5}", problem) == Score(-1.0, False)


def test_the_function_gets_the_rows_fields(tmp_path):
    rows = [{"question": "1+1?", "answer": "#### 2", "level": 3}, {"question": "2+2?", "answer": "#### 4", "level": 5}]
    path = tmp_path / "levels.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from scalectl.rl.data.splits import load_prompt_sets

    data = {"source": str(path), "train_size": 1}
    mine = Recipe.model_validate({"data": data, "eval": {"prompts": 1},
                                  "reward": {"function": "custom_rewards:level_field"}})
    train, held = load_prompt_sets(mine)
    score = scorer_for(mine)
    got = {p.fields["question"]: score(f"\\boxed{{{p.answer.answers[0]}}}", p) for p in train + held}
    assert got == {"1+1?": Score(3.0, True), "2+2?": Score(5.0, True)}
    assert score("\\boxed{9}", train[0]) == Score(0.0, False)
    builtin = load_prompt_sets(Recipe.model_validate({"data": data, "eval": {"prompts": 1}}))
    assert [p.fields for split in builtin for p in split] == [{}, {}]      # the checker reads none


@pytest.mark.parametrize("name,message", [
    ("raises", "reward.function = 'custom_rewards:raises' raised ValueError: no answer here (at "),
    ("returns_string", "reward.function = 'custom_rewards:returns_string' returned str '1.0': a reward function "
                       "returns a float (correct when > 0) or a scalectl.rl.reward.score.Score(reward, correct)"),
    ("hangs", "reward.function = 'custom_rewards:hangs' did not return within reward.timeout_s = 0.5 s on the "
              "completion '\\\\boxed{3}' (gold '3'); its process was killed"),
    ("exits", "reward.function = 'custom_rewards:exits': the process exited with status 3 while scoring"),
    ("no_such_function", "reward.function = 'custom_rewards:no_such_function': module 'custom_rewards'"),
])
def test_a_failing_function_is_a_clear_error_naming_it(name, message):
    score = Scorer(f"custom_rewards:{name}", timeout_s=0.5)
    with pytest.raises(RewardFunctionError) as err:
        score("\\boxed{3}", Problem(0, "1+2=", "3"))
    assert message in str(err.value)
    assert isinstance(err.value, UserError)
    assert Scorer("custom_rewards:half_for_a_box", timeout_s=0.5)("\\boxed{3}", Problem(0, "1+2=", "3")) == \
        Score(1.0, True)                                                  # the next call starts afresh


def test_a_hanging_worker_does_not_outlive_its_scoring_process(tmp_path):
    """The scoring process is killed (SIGKILL: no clean-up of its own) while the function hangs
    in its worker: the worker exits too."""
    import signal
    import subprocess
    import time

    from scalectl.launch.local import pid_alive

    calls = tmp_path / "calls"
    code = ("from types import SimpleNamespace; from scalectl.rl.reward.scoring import Scorer; "
            "Scorer('custom_rewards:hangs', timeout_s=3600)('x', SimpleNamespace(answer='3'))")
    env = dict(os.environ, **{CALLS_ENV: str(calls)}, PYTHONPATH=os.pathsep.join([TESTS, *sys.path]))
    scoring = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 120
        while not (calls.exists() and calls.read_text().endswith("\n")):
            assert time.monotonic() < deadline and scoring.poll() is None, "the worker never called the function"
            time.sleep(0.05)
        [(worker, parent)] = _calls(calls)
        assert parent == scoring.pid and pid_alive(worker)
    finally:
        scoring.send_signal(signal.SIGKILL)
        scoring.wait()
    deadline = time.monotonic() + 60
    while pid_alive(worker):
        assert time.monotonic() < deadline, f"worker {worker} outlived its scoring process"
        time.sleep(0.05)


@pytest.mark.parametrize("value,message", [
    (True, "returned bool True"), (None, "returned NoneType None"), (float("nan"), "returned the reward nan"),
    (Score(float("inf"), True), "returned the reward inf"), (Score(1.0, 1), "correct is int 1, not a bool"),
    (Score("1", True), "reward is str '1', not a float"),
])
def test_what_is_not_a_reward_is_refused(value, message):
    from scalectl.rl.reward.score import as_score

    with pytest.raises((TypeError, ValueError), match=message.replace("(", r"\(")):
        as_score(value)
    assert as_score(0) == Score(0.0, False) and as_score(0.25) == Score(0.25, True)
    assert as_score(Score(-0.5, True)) == Score(-0.5, True)


# --------------------------------------------------------------------------- out of range

#: A reward function file of the user's: the reward is the number written in the completion's
#: ``\boxed{}`` (Python's own literal: ``1e300``, ``10**400``), returned as each shape returns it.
HUGE_REWARDS = """
import numbers
import re

from scalectl.rl.reward.score import Score


def _number(completion):
    return eval(re.search(r"boxed\\{(.*)\\}", completion).group(1))


def as_float(completion, gold, fields):
    return _number(completion)


def as_score(completion, gold, fields):
    return Score(_number(completion), True)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": _number(solution_str), "acc": True}


def reward_func(completions, **kwargs):
    return [_number(c) for c in completions]


class Unreadable:
    # says it is a real number, but cannot be turned into a float

    def __float__(self):
        raise ArithmeticError("no float here")

    def __repr__(self):
        return "Unreadable()"


numbers.Real.register(Unreadable)


def unreadable(completion, gold, fields):
    return Unreadable()
"""


@pytest.fixture
def huge_rewards(tmp_path, monkeypatch):
    """``huge_rewards.py`` (:data:`HUGE_REWARDS`) in a folder on ``sys.path`` (the workers get it
    as their ``PYTHONPATH``)."""
    (tmp_path / "huge_rewards.py").write_text(HUGE_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "huge_rewards.py"
    sys.modules.pop("huge_rewards", None)


def _scored_group(function: str, rewards: list[str]):
    """The group of completions ``\\boxed{R}`` for each R, scored as a run scores it (the recipe's
    scorer, the function in its worker process)."""
    recipe = Recipe.model_validate({"reward": {"function": function}})
    [group] = score_groups([_comps([f"\\boxed{{{r}}}" for r in rewards])], [Problem(0, "1+2=", "3")], [0],
                           recipe.length, scorer_for(recipe))
    return group


@pytest.mark.parametrize("name", ["as_float", "as_score", "compute_score", "reward_func"])
@pytest.mark.parametrize("written,shown", [
    ("1e300", "1e+300"), ("-3.5e38", "-3.5e+38"), ("2e15", "2000000000000000.0"),   # finite floats beyond the bound
    ("10**400", "int 1.000e+400 (401 digits)"), ("-7 * 10**309", "int -7.000e+309 (310 digits)"),
])
def test_a_reward_beyond_the_bound_is_refused_naming_the_function_the_value_and_the_range(huge_rewards, name,
                                                                                          written, shown):
    """A float too large for float32 became inf and the group's advantages NaN; an int too large for
    a float killed the worker ("the process exited with status -9"). Both are refused, in every
    convention, naming what the function returned and the range a reward must lie in."""
    from scalectl.rl.reward.score import MAX_ABS_REWARD

    with pytest.raises(RewardFunctionError) as err:
        _scored_group(f"huge_rewards:{name}", ["1", written, "-1"])
    message = str(err.value)
    assert message.startswith(f"reward.function = 'huge_rewards:{name}' returned ")
    assert shown in message and "exited" not in message
    assert f"a reward must be a finite number from -{MAX_ABS_REWARD:g} to {MAX_ABS_REWARD:g}" in message
    if name == "reward_func":                                           # one call per group: the entry
        assert "(entry 1 of its list), on a batch of 3 completions" in message
    else:
        assert f"the completion '\\\\boxed{{{written}}}'" in message
    # the worker is still there and answers the next call
    assert _scored_group(f"huge_rewards:{name}", ["2", "-2"]).rewards.tolist() == [2.0, -2.0]


def test_a_value_whose_reading_raises_is_named_and_the_worker_lives_on(huge_rewards):
    with pytest.raises(RewardFunctionError) as err:
        _scored_group("huge_rewards:unreadable", ["1"])
    assert str(err.value).startswith("reward.function = 'huge_rewards:unreadable' returned Unreadable Unreadable(), "
                                     "which could not be read as a reward (ArithmeticError: no float here), on the "
                                     "completion '\\\\boxed{1}'"), str(err.value)


def test_rewards_at_the_bound_give_finite_advantages_in_every_normalization(huge_rewards):
    """The bound is what the float32 advantages hold: rewards of +-MAX_ABS_REWARD (also as ints)
    are accepted and their advantages are finite (and exact: +-1 for a two-valued group)."""
    from scalectl.rl.reward.score import MAX_ABS_REWARD
    from scalectl.rl.train.batch import build_train_batch

    top = f"{MAX_ABS_REWARD:.0f}"
    group = _scored_group("huge_rewards:as_float", [top, f"-{top}", top, f"-{MAX_ABS_REWARD!r}"])
    top32 = torch.tensor(MAX_ABS_REWARD, dtype=torch.float32).item()     # 999999986991104.0
    assert group.rewards.tolist() == [top32, -top32] * 2
    for norm in ("prompt", "batch"):
        assert build_train_batch([group], norm, pad_id=0).advantages.tolist() == pytest.approx([1, -1, 1, -1])
    assert build_train_batch([group], "none", pad_id=0).advantages.tolist() == \
        [top32, -top32] * 2


# --------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    """A freshly initialised tiny policy (no warm start: the rewards are what is tested)."""
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    return str(save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("policy") / "tiny"))


P, G, STEPS, EVAL_PROMPTS, K = 4, 4, 2, 8, 2
SETS = [f"batch.prompts_per_step={P}", f"batch.generations_per_prompt={G}", f"eval.prompts={EVAL_PROMPTS}",
        f"eval.samples_per_prompt={K}", "eval.every_steps=2", "data.train_size=40", f"budget.steps={STEPS}",
        "length.max_new_tokens=16", "length.control=none", "filter.zero_variance=false", "logging.rollouts=true",
        "reward.function=custom_rewards:digit_share", "checkpoint.every_steps=100",
        "reward.truncated=as_written"]   # an untrained policy: most completions are cut, scored as written


def _digit_share(text: str) -> float:
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def _trained_rewards_are_the_functions(run_dir: Path) -> list[dict]:
    """Every trained completion's reward is ``digit_share`` of its decoded text (float32)."""
    from scalectl.rl.policy.model import build_tokenizer

    tok = build_tokenizer()
    lines = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(lines) == STEPS * P * G
    for x in lines:
        want = float(torch.tensor(_digit_share(tok.decode(x["token_ids"], skip_special_tokens=True))))
        assert x["reward"] == want
    assert len({x["reward"] for x in lines}) > 2            # partial credit, not +-1
    return lines


def _calls(path: Path) -> list[tuple[int, int]]:
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()]


def test_a_sync_run_trains_on_the_functions_rewards_in_its_process(tmp_path, monkeypatch, policy):
    """sync in one process: the function is called for every training and every evaluation
    completion (from this process: each call's parent), and its partial credit is what trains."""
    from scalectl.rl.data.splits import load_prompt_sets
    from scalectl.rl.run import run_training
    from scalectl.rl.schedule.modes import schedule_for

    calls = tmp_path / "calls"
    monkeypatch.setenv(CALLS_ENV, str(calls))
    recipe = load("recipes/scalerl.toml", "setups/tiny-cpu.toml", ["async.mode=sync", f"model.path={policy}", *SETS])
    train, held = load_prompt_sets(recipe)
    points, run_dir = [], tmp_path / "run"
    run_dir.mkdir()
    run_training(recipe, run_dir, schedule=schedule_for(recipe.async_), sink=points.append, train_problems=train,
                 eval_problems=held)
    assert [p.step for p in points] == [0, 2]
    parents = [parent for _, parent in _calls(calls)]
    assert parents == [os.getpid()] * (STEPS * P * G + len(points) * EVAL_PROMPTS * K)
    lines = _trained_rewards_are_the_functions(run_dir)
    steps = [json.loads(x) for x in (run_dir / "steps.jsonl").read_text().splitlines()]
    for s in steps:
        mine = [x["reward"] for x in lines if x["step"] == s["step"] - 1]
        assert s["reward"] == pytest.approx(sum(mine) / len(mine), rel=1e-6)


def _pipeline_env(calls: Path) -> dict:
    return {CALLS_ENV: str(calls), "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}


@pytest.mark.slow   # 100-115 s on a busy 2-core machine: three processes start and import torch
def test_a_pipeline_calls_the_function_in_every_generator_and_the_evaluating_trainer(tmp_path, policy):
    """pipeline with 2 generator processes: every generator process and the trainer process (its
    held-out evaluations) call the function; the trainer exactly for k samples of every held-out
    prompt at each point, and the trained rewards are the function's."""
    calls = tmp_path / "calls"
    args = ["run", "recipes/scalerl.toml", "--name", "pipe", "--runs-dir", str(tmp_path / "runs"),
            "--set", f"model.path={policy}", "--set", "hardware.generators=2", "--set", "async.k=1",
            *[a for s in SETS for a in ("--set", s)]]
    run_cli(*args, db=tmp_path / "s.db", check=True, timeout=600, env=_pipeline_env(calls))
    run_dir = tmp_path / "runs" / "pipe"
    tasks = json.loads((run_dir / "pipeline" / "tasks.json").read_text())["tasks"]
    by_role = {t["pid"]: t["role"] for t in tasks}
    parents = [parent for _, parent in _calls(calls)]
    assert set(parents) == set(by_role)                    # both generators and the trainer
    shown = json.loads(run_cli("show", "pipe", "--json", db=tmp_path / "s.db", check=True).stdout)
    trainer = next(pid for pid, role in by_role.items() if role == "trainer")
    assert parents.count(trainer) == len(shown["points"]) * EVAL_PROMPTS * K
    assert sum(parents.count(pid) for pid, role in by_role.items() if role == "generator") >= STEPS * P * G
    _trained_rewards_are_the_functions(run_dir)


@pytest.mark.slow   # 45-85 s there: the processes start before the first batch fails
def test_a_pipeline_whose_function_returns_a_string_fails_naming_it(tmp_path, policy):
    args = ["run", "recipes/scalerl.toml", "--name", "bad", "--runs-dir", str(tmp_path / "runs"),
            "--set", f"model.path={policy}", *[a for s in SETS for a in ("--set", s)],
            "--set", "reward.function=custom_rewards:returns_string"]
    out = run_cli(*args, db=tmp_path / "s.db", timeout=600, env=_pipeline_env(tmp_path / "calls"))
    assert out.returncode == 1
    shown = json.loads(run_cli("show", "bad", "--json", db=tmp_path / "s.db", check=True).stdout)["run"]
    assert shown["status"] == "failed"
    assert ("RewardFunctionError: reward.function = 'custom_rewards:returns_string' returned str '1.0': a reward "
            "function returns a float") in shown["error"], shown["error"]
