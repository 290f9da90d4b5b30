"""Synthetic arithmetic prompt sets: answers, reference completions, determinism, disjoint splits."""

import pytest

from scalectl.rl.reward.checker import check
from scalectl.rl.data.arithmetic import (
    DIFFICULTIES, HELD_OUT_RESERVE, check_sizes, distinct_problems, eval_problems, max_train_size, reserve_size,
    make_splits, running_sums, sft_target, train_problems,
)


def test_running_sums_and_target_by_hand():
    assert running_sums("47+8-63=") == [55, -8]
    assert sft_target("47+8-63=") == "55;-8;\\boxed{-8}"
    assert sft_target("12+345+6=") == "357;363;\\boxed{363}"
    assert sft_target("5-9=") == "-4;\\boxed{-4}"


@pytest.mark.parametrize("bad", ["12+3", "=", "+3=", "1+=", "1*2=", "12="])
def test_running_sums_rejects_non_chains(bad):
    with pytest.raises(ValueError, match="arithmetic chain"):
        running_sums(bad)


def test_problems_follow_their_difficulty_and_answers_are_right():
    for d, spec in DIFFICULTIES.items():
        for p in eval_problems(20, seed=3, difficulty=d):
            numbers = p.prompt[:-1].replace("-", "+").split("+")
            assert len(numbers) == spec.terms
            assert all(0 <= int(x) <= spec.max_value for x in numbers)
            assert set(c for c in p.prompt if not c.isdigit()) <= set(spec.ops) | {"="}
            assert int(p.answer) == eval(p.prompt[:-1])  # independent: Python evaluates the chain
            assert check(sft_target(p.prompt), p.answer)


def test_deterministic_and_prefix_stable():
    a = eval_problems(50, seed=7, difficulty=3)
    assert a == eval_problems(50, seed=7, difficulty=3)
    assert eval_problems(20, seed=7, difficulty=3) == a[:20]
    assert eval_problems(50, seed=8, difficulty=3) != a
    assert [p.id for p in a] == list(range(50))
    assert train_problems(30, seed=7, difficulty=3) == train_problems(60, seed=7, difficulty=3)[:30]


def test_splits_are_disjoint_and_distinct():
    train, held = make_splits(3000, 1000, seed=0, difficulty=2)
    assert len({p.prompt for p in train}) == 3000 and len({p.prompt for p in held}) == 1000
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    # the held-out reserve is excluded whatever the held-out size
    big = {p.prompt for p in eval_problems(HELD_OUT_RESERVE, seed=0, difficulty=3)}
    assert not big & {p.prompt for p in train_problems(2000, seed=0, difficulty=3)}
    assert reserve_size(3) == HELD_OUT_RESERVE and reserve_size(1) == 100 // 4


def test_clear_errors():
    with pytest.raises(ValueError, match="data.difficulty = 0"):
        eval_problems(5, difficulty=0)
    with pytest.raises(ValueError, match="at most"):
        eval_problems(HELD_OUT_RESERVE + 1)
    with pytest.raises(ValueError, match="at most 25"):
        eval_problems(26, difficulty=1)      # 100 problems: a quarter is held out
    with pytest.raises(ValueError, match=r"data.train_size = 200: .* 100 distinct .* at most 75 training"):
        train_problems(200, difficulty=1)   # 100 problems exist at difficulty 1, 25 held out


def _enumerate(difficulty: int) -> set[str]:
    """Every prompt of a 2-term level, written out independently of the generator."""
    spec = DIFFICULTIES[difficulty]
    assert spec.terms == 2
    return {f"{a}{op}{b}=" for a in range(spec.max_value + 1) for b in range(spec.max_value + 1) for op in spec.ops}


@pytest.mark.parametrize("difficulty", [1, 2])
def test_the_training_limit_is_what_the_level_can_generate(difficulty):
    """max_train_size is every distinct problem less the held-out reserve: that many training
    prompts are generated, all distinct and outside the reserve, and one more is refused."""
    every = _enumerate(difficulty)
    assert distinct_problems(difficulty) == len(every)
    limit = max_train_size(difficulty)
    assert limit == len(every) - reserve_size(difficulty)
    if difficulty == 1:                  # 100 problems: generating all 75 is quick
        train = {p.prompt for p in train_problems(limit, seed=4, difficulty=difficulty)}
        reserve = {p.prompt for p in eval_problems(reserve_size(difficulty), seed=4, difficulty=difficulty)}
        assert len(train) == limit and train | reserve == every and not train & reserve
    assert check_sizes(limit, reserve_size(difficulty), difficulty) == []
    problems = check_sizes(limit + 1, reserve_size(difficulty) + 1, difficulty)
    assert [p.split(" = ")[0] for p in problems] == ["data.train_size", "eval.prompts"]


def test_a_mixture_of_levels_is_disjoint_deterministic_and_prefix_stable():
    mix = {8: 0.3}
    train, held = make_splits(6000, 400, seed=5, difficulty=2, mix=mix)
    assert [p.id for p in train] == list(range(6000)) and [p.id for p in held] == list(range(400))
    assert len({p.prompt for p in train}) == 6000 and not {p.prompt for p in train} & {p.prompt for p in held}
    # every held-out prompt of either level stays out of training, whatever the held-out size
    for level in (2, 8):
        reserve = {p.prompt for p in eval_problems(reserve_size(level), seed=5, difficulty=level)}
        assert not reserve & {p.prompt for p in train}
    terms = [p.prompt.count("+") + p.prompt.count("-") + 1 for p in train]
    assert set(terms) == {2, 6}
    share = terms.count(6) / len(terms)
    assert abs(share - 0.3) < 4 * (0.3 * 0.7 / len(terms)) ** 0.5      # binomial sd, 4 of them
    for p in train[:200] + held[:200]:
        assert int(p.answer) == eval(p.prompt[:-1])
    assert train_problems(1000, seed=5, difficulty=2, mix=mix) == train[:1000]
    assert eval_problems(100, seed=5, difficulty=2, mix=mix) == held[:100]
    assert make_splits(6000, 400, seed=5, difficulty=2, mix=mix) == (train, held)
    assert make_splits(6000, 400, seed=6, difficulty=2, mix=mix)[0] != train


def test_a_mixture_counts_each_level_against_its_own_limit():
    # level 2 supplies 15,000 training prompts: 0.7 of 30,000 is more, 0.7 of 20,000 is not
    assert check_sizes(20000, 500, 2, {8: 0.3}) == []
    (problem,) = check_sizes(30000, 500, 2, {8: 0.3})
    assert problem.startswith("data.train_size = 30000 (") and "at level 2" in problem and "at most 15,000" in problem
    with pytest.raises(ValueError, match="data.train_size = 30000"):
        train_problems(30000, difficulty=2, mix={8: 0.3})
    with pytest.raises(ValueError, match="data.mix names data.difficulty"):
        train_problems(10, difficulty=2, mix={2: 0.3})
    with pytest.raises(ValueError, match="leave a share"):
        eval_problems(10, difficulty=2, mix={8: 0.6, 7: 0.4})


def test_the_mixture_key_is_validated_and_hash_neutral_when_empty():
    from scalectl.errors import UserError
    from scalectl.recipe.load import load

    from scalectl.recipe.schema import Recipe

    plain = Recipe.model_validate({"data": {"difficulty": 2}})
    assert plain.data.mix == {}
    assert Recipe.model_validate({"data": {"difficulty": 2, "mix": {}}}).content_hash == plain.content_hash
    mixed = Recipe.model_validate({"data": {"difficulty": 2, "mix": {"8": 0.3}}})
    assert mixed.data.mix == {"8": 0.3} and mixed.content_hash != plain.content_hash
    assert load("scalerl", "tiny-cpu").data.mix == {"8": 0.3}          # the default setup mixes level 8 in
    for bad, says in [("{3=0.3}", "names data.difficulty = 3"), ("{0=0.3}", "level '0' is not one of 1-9"),
                      ("{8=1.0}", r"not in \(0, 1\)"), ("{8=0.6,7=0.4}", "add up to 1")]:
        with pytest.raises(UserError, match=says) as err:
            load("scalerl", "tiny-cpu", [f"data.mix={bad}"])
        assert "data.mix" in str(err.value)


def test_the_default_setup_has_prompts_for_four_times_its_budget():
    """The default setup's pool: learnable prompts (level 3) within what their level can supply,
    level-8 ones whose reference completions need more tokens than a rollout gets (never
    solved, never retired), none of them held out, and at 4x the budget the sampler's draws
    (32 a step) still meet no prompt twice, so retiring solved prompts cannot empty the pool."""
    from scalectl.recipe.load import load
    from scalectl.rl.batches.filters import PromptSampler
    from scalectl.rl.policy.model import build_tokenizer

    recipe = load("scalerl", "tiny-cpu")
    d = recipe.data
    assert d.difficulty == 3 and d.mix == {"8": 0.3}
    assert check_sizes(d.train_size, recipe.eval.prompts, d.difficulty, d.mix, seed=d.seed) == []
    train = train_problems(d.train_size, seed=d.seed, difficulty=d.difficulty, mix=d.mix)
    held = eval_problems(recipe.eval.prompts, seed=d.seed, difficulty=d.difficulty, mix=d.mix)
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert len({p.prompt for p in train}) == d.train_size
    long = [p for p in train if p.prompt.count("+") + p.prompt.count("-") == 5]
    learnable = len(train) - len(long)
    # 0.7 of 100,000 within 5 binomial sd (sd = sqrt(100000 * 0.7 * 0.3) = 145)
    assert abs(learnable - 0.7 * d.train_size) < 5 * 145
    tok = build_tokenizer()
    shortest = min(len(tok.encode(sft_target(p.prompt), add_special_tokens=False)) for p in long[:500])
    assert shortest > recipe.length.max_new_tokens
    draws = 4 * recipe.budget.steps * recipe.batch.prompts_per_step
    sampler = PromptSampler(len(train), seed=d.seed)
    drawn = [i for _ in range(4 * recipe.budget.steps) for i in sampler.next(recipe.batch.prompts_per_step)]
    assert recipe.filter.retire_solved and len(drawn) == draws == len(set(drawn))
    assert sum(1 for i in drawn if train[i].prompt.count("+") + train[i].prompt.count("-") == 1) > 0.65 * draws


def test_a_layer_that_sets_the_mixture_replaces_it_whole():
    from scalectl.recipe.load import load

    assert load("grpo", "tiny-cpu", ["data.mix={}"]).data.mix == {}
    assert load("grpo", "tiny-cpu", ["data.mix={7=0.2}"]).data.mix == {"7": 0.2}
    assert load("grpo", "tiny-cpu", ["data.mix={}"]).content_hash != load("grpo", "tiny-cpu").content_hash
