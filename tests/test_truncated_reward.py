"""``reward.truncated``: a completion cut at the length limit scores that reward and is not
correct, in training (score_groups) and in the held-out pass rate (evaluate); unset, it is
scored as written."""

from __future__ import annotations

import pytest

from custom_rewards import CALLS_ENV
from scalectl.errors import UserError
from scalectl.recipe.load import load
from scalectl.recipe.schema import Recipe
from scalectl.rl.data.arithmetic import Problem, eval_problems
from scalectl.rl.reward.score import Score
from scalectl.rl.reward.scoring import Scorer, scorer_for
from scalectl.rl.rollout.base import Completion
from scalectl.rl.rollout.groups import rollout_stats, score_groups

PROBLEM = Problem(0, "1+2=", "3")


def _comps(cases):
    """Completions of (text, finish_reason) pairs; the token ids stand for the text's length."""
    return [Completion(0, [1], [2] * len(t), [-0.5] * len(t), [0] * len(t), reason, t) for t, reason in cases]


CASES = [("3;\\boxed{3}", "stop"),                  # right, ended
         ("3;\\boxed{3}}9;;1", "length"),            # right answer, then cut at the limit without ending
         ("3;\\boxed{4}77", "length"),               # wrong and cut
         ("3;\\boxed{5}", "stop")]                   # wrong, ended


def test_a_truncated_completion_scores_the_setting_and_is_not_correct():
    as_written = Scorer().completions(_comps(CASES), PROBLEM)
    assert as_written == [Score(1.0, True), Score(1.0, True), Score(-1.0, False), Score(-1.0, False)]
    cut = Scorer(truncated=-1.0).completions(_comps(CASES), PROBLEM)
    assert cut == [Score(1.0, True), Score(-1.0, False), Score(-1.0, False), Score(-1.0, False)]
    assert Scorer(truncated=0.0).completions(_comps(CASES), PROBLEM)[1:3] == [Score(0.0, False)] * 2
    # a group wholly cut short calls nothing
    assert Scorer(truncated=-1.0).completions(_comps(CASES[1:3]), PROBLEM) == [Score(-1.0, False)] * 2


def test_a_users_function_is_not_called_for_truncated_completions(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv(CALLS_ENV, str(calls))
    score = Scorer("custom_rewards:half_for_a_box", truncated=-2.0)
    assert score.completions(_comps(CASES), PROBLEM) == [Score(1.0, True), Score(-2.0, False),
                                                         Score(-2.0, False), Score(0.5, True)]
    assert len(calls.read_text().splitlines()) == 2            # the two that ended


def test_training_groups_get_it_from_the_recipe():
    recipe = Recipe.model_validate({"reward": {"truncated": -1.0}, "length": {"control": "none"}})
    assert scorer_for(recipe).truncated == -1.0
    [group] = score_groups([_comps(CASES)], [PROBLEM], [0], recipe.length, scorer_for(recipe))
    assert group.rewards.tolist() == [1.0, -1.0, -1.0, -1.0] and group.correct == [True, False, False, False]
    stats = rollout_stats([group])
    assert stats["truncation_rate"] == 0.5 and stats["pass_rate"] == 0.25
    [plain] = score_groups([_comps(CASES)], [PROBLEM], [0], Recipe().length, scorer_for(Recipe()))
    assert plain.rewards.tolist() == [1.0, 1.0, -1.0, -1.0]


def test_the_held_out_pass_rate_counts_a_truncated_right_answer_as_wrong():
    """The shipped warm start (level 3), 9 new tokens: a positive three-digit answer's reference
    ("503;\\boxed{503}", 9 tokens) fits but its stop token does not, so many right answers are cut.  The pass rate
    with ``truncated`` set equals the share of right completions that ended, counted by hand on
    the same completions (the same seed), and is below the rate that counts them all."""
    from scalectl.rl.evaluation.pass_rate import evaluate
    from scalectl.rl.rollout.cpu import CPURolloutEngine
    from scalectl.rl.rollout.sampling import SamplingParams
    from scalectl.rl.train.warmstart import shipped_root

    engine = CPURolloutEngine.from_pretrained(shipped_root() / "tiny-cpu")
    problems = eval_problems(24, seed=0, difficulty=3)
    params, k, seed = SamplingParams(max_new_tokens=9), 4, 5
    groups = engine.generate([p.prompt for p in problems], k, params, seed=seed)   # one chunk: seed + 0
    right = [[Scorer()(c.text, p).correct for c in comps] for p, comps in zip(problems, groups)]
    ended = [[c.finish_reason == "stop" for c in comps] for comps in groups]
    n = len(problems) * k
    by_hand_all = sum(map(sum, right)) / n
    by_hand_ended = sum(r and e for rs, es in zip(right, ended) for r, e in zip(rs, es)) / n
    assert by_hand_all - by_hand_ended >= 4 / n            # the case under test occurs
    plain = evaluate(engine, problems, params, samples_per_prompt=k, seed=seed, score=Scorer())
    cut = evaluate(engine, problems, params, samples_per_prompt=k, seed=seed, score=Scorer(truncated=-1.0))
    assert plain["pass_rate"] == pytest.approx(by_hand_all, abs=1e-12)
    assert cut["pass_rate"] == pytest.approx(by_hand_ended, abs=1e-12)
    assert cut["truncation_rate"] == plain["truncation_rate"]


def test_the_setting_is_in_the_hash_only_when_set_and_bad_values_are_refused():
    base = load("scalerl", setup="simulated").content_hash
    assert load("scalerl", setup="simulated", overrides=["reward.truncated=as_written"]).content_hash == base
    assert load("scalerl", setup="simulated", overrides=["reward.truncated=-1"]).content_hash != base
    # the default setup sets -1; as_written takes it back
    tiny = load("scalerl", setup="tiny-cpu")
    assert scorer_for(tiny).truncated == -1.0
    assert scorer_for(load("scalerl", setup="tiny-cpu", overrides=["reward.truncated=as_written"])).truncated is None
    for bad, words in (("wrong", "as_written"), ("inf", "finite"), ("1e300", "from -1e+15 to 1e+15"),
                       ("-2e15", "not -2000000000000000.0")):
        with pytest.raises(UserError) as err:
            load("scalerl", setup="simulated", overrides=[f"reward.truncated={bad}"])
        assert "reward.truncated" in str(err.value) and words in str(err.value), str(err.value)
    assert scorer_for(load("scalerl", setup="simulated", overrides=["reward.truncated=-1e15"])).truncated == -1e15
