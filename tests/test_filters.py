"""Zero-variance filter, dynamic-sampling refill, retiring solved prompts, and the prompt sampler."""

import json

import pytest
import torch

from scalectl.rl.batches.filters import (
    AllPromptsRetired,
    DynamicSamplingExhausted,
    PromptHistory,
    PromptSampler,
    groups_to_refill,
    zero_variance_mask,
)

# -- zero variance ------------------------------------------------------------------------------


def test_zero_variance_mask_drops_groups_with_equal_rewards():
    # group 0 all correct, group 3 mixed, group 5 all wrong, group 9 a single completion,
    # group 4 mixed only through a length penalty (1.0 vs 0.75)
    rewards = torch.tensor([1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 0.5, 1.0, 0.75])
    groups = torch.tensor([0, 0, 0, 3, 3, 3, 5, 5, 5, 9, 4, 4])
    keep = zero_variance_mask(rewards, groups)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False] * 3 + [True] * 3 + [False] * 3 + [False] + [True] * 2


def test_zero_variance_mask_interleaved_rows():
    keep = zero_variance_mask(torch.tensor([1, -1, 1, 1]), torch.tensor([0, 1, 1, 0]))
    assert keep.tolist() == [False, True, True, False]


# -- dynamic sampling ---------------------------------------------------------------------------


def test_groups_to_refill():
    assert groups_to_refill(n_kept=30, n_target=48, refill_round=0, max_refill_rounds=3) == 18
    # 18 missing at a keep rate of 0.6: 30 groups (not 31, although 18 / 0.6 = 30.000000000000004 in floats)
    assert groups_to_refill(30, 48, 0, 3, keep_rate=0.6) == 30
    assert groups_to_refill(30, 48, 1, 3, keep_rate=0.25) == 72
    assert groups_to_refill(48, 48, 5, 3) == 0  # full: no error even past the bound
    assert groups_to_refill(50, 48, 0, 3) == 0


def test_dynamic_sampling_exhausted_names_the_bound():
    with pytest.raises(DynamicSamplingExhausted, match=r"filter\.max_refill_rounds = 3") as err:
        groups_to_refill(40, 48, refill_round=3, max_refill_rounds=3)
    assert "kept 40 of the 48 groups" in str(err.value)
    assert (err.value.n_kept, err.value.n_target, err.value.max_refill_rounds) == (40, 48, 3)


# -- retire solved ------------------------------------------------------------------------------


def test_retire_latest_vs_cumulative():
    latest, cumulative = PromptHistory(rule="latest"), PromptHistory(rule="cumulative")
    # appearances of prompt 4 (n = 16): cumulative pass rates 10/16 = 0.625, 25/32 = 0.781,
    # 41/48 = 0.854, 57/64 = 0.891, 73/80 = 0.9125
    steps = [(10, False, False), (15, True, False), (16, True, False), (16, True, False), (16, True, True)]
    for n_correct, want_latest, want_cumulative in steps:
        assert latest.update(4, n_correct, 16) is want_latest
        assert cumulative.update(4, n_correct, 16) is want_cumulative
    assert cumulative.pass_rate(4) == pytest.approx(73 / 80)
    assert latest.pass_rate(4) == 1.0
    assert latest.retired == {4} and cumulative.retired == {4}


def test_retirement_reaches_threshold_exactly_and_is_final():
    h = PromptHistory(threshold=0.9)
    assert h.update(1, 8, 10) is False  # 0.8
    assert h.update(1, 9, 10) is True  # 0.9 reaches the threshold
    assert h.update(1, 0, 10) is True  # a late result does not bring it back
    assert h.is_retired(1) and not h.is_retired(2)
    assert h.pass_rate(2) != h.pass_rate(2)  # never seen: NaN


def test_history_round_trips_through_json():
    h = PromptHistory(threshold=0.75, rule="cumulative")
    h.update(3, 2, 4)
    h.update(3, 4, 4)
    h.update(11, 1, 4)
    back = PromptHistory.from_dict(json.loads(json.dumps(h.to_dict())))
    assert back == h
    assert back.retired == {3} and back.history[3] == [(2, 4), (4, 4)]


def test_history_rejects_bad_input():
    with pytest.raises(ValueError, match="retire_rule = 'mean' is not one of latest, cumulative"):
        PromptHistory(rule="mean")
    with pytest.raises(ValueError, match="retire_threshold"):
        PromptHistory(threshold=1.5)
    with pytest.raises(ValueError, match="n_correct=5, n=4"):
        PromptHistory().update(0, 5, 4)


# -- sampler ------------------------------------------------------------------------------------


def test_sampler_epochs_are_permutations_and_deterministic():
    a, b = PromptSampler(10, seed=7), PromptSampler(10, seed=7)
    draws = a.next(10) + a.next(10)
    assert sorted(draws[:10]) == list(range(10)) and sorted(draws[10:]) == list(range(10))
    assert draws[:10] != draws[10:]  # each epoch has its own shuffle
    assert b.next(4) + b.next(16) == draws  # batch boundaries do not change the order
    assert PromptSampler(10, seed=8).next(10) != draws[:10]


def test_sampler_resume_mid_epoch_gives_the_same_continuation():
    a = PromptSampler(10, seed=3)
    retired = {2, 5}
    a.next(4, retired)
    state = json.loads(json.dumps(a.state_dict()))
    continuation = [a.next(4, retired) for _ in range(5)]  # crosses two epoch boundaries
    b = PromptSampler(10, seed=0)  # the seed comes from the state
    b.load_state_dict(state)
    assert [b.next(4, retired) for _ in range(5)] == continuation
    assert not any(p in retired for batch in continuation for p in batch)


def test_sampler_skips_prompts_retired_during_an_epoch():
    s = PromptSampler(6, seed=1)
    first = s.next(2)
    rest = s.next(4, retired={first[0]})  # retiring an already-seen prompt changes nothing this epoch
    assert sorted(first + rest) == list(range(6))
    nxt = s.next(5, retired={first[0]})  # next epoch: 5 active prompts, each once
    assert sorted(nxt) == sorted(set(range(6)) - {first[0]})


def test_sampler_raises_when_every_prompt_is_retired():
    s = PromptSampler(3, seed=0)
    with pytest.raises(AllPromptsRetired, match="all 3 prompts are retired"):
        s.next(1, retired={0, 1, 2})
    with pytest.raises(ValueError, match="state is for 4 prompts but this prompt set has 3"):
        s.load_state_dict(PromptSampler(4, seed=0).state_dict())


# -- refill rounds of a whole step (the loop's collect_batch) -------------------------------------


def _scripted_fetch(keeps: list[int]):
    """``fetch(want, round)`` for collect_batch: round r returns ``want`` groups of 2 completions,
    of which ``keeps[r]`` have mixed rewards (kept) and the rest all-wrong (dropped)."""
    from scalectl.rl.rollout.groups import Group
    from scalectl.rl.rollout.base import Completion

    calls: list[tuple[int, int]] = []

    def fetch(want: int, refill_round: int) -> list:
        calls.append((want, refill_round))
        out = []
        for i in range(want):
            mixed = i < keeps[refill_round]
            correct = [True, False] if mixed else [False, False]
            comps = [Completion(0, [1], [2], [-0.5], [0], "stop", "x") for _ in correct]
            out.append(Group(len(out), comps, correct, torch.tensor([1.0 if c else -1.0 for c in correct])))
        return out

    return fetch, calls


def _dapo(rounds: int):
    from conftest import ROOT
    from scalectl.recipe.load import load

    return load(ROOT / "recipes" / "dapo.toml", ROOT / "setups" / "tiny-cpu.toml",
                [f"filter.max_refill_rounds={rounds}", "batch.prompts_per_step=16"])


@pytest.mark.parametrize("rounds", [1, 2, 4])
def test_collect_batch_does_exactly_max_refill_rounds_then_trains_short(rounds):
    """11 of 16 groups kept in the first round and none in any refill: exactly ``rounds``
    refills run (rounds 1..N after round 0), then the batch is trained as it is: its 11 kept
    groups, with short_batch set and the reason naming the rounds done and what to change."""
    from scalectl.rl.batches.collect import collect_batch
    from scalectl.rl.loop import new_state

    recipe = _dapo(rounds)
    assert recipe.batch.prompts_per_step == 16
    fetch, calls = _scripted_fetch([11] + [0] * rounds)
    kept, stats = collect_batch(recipe, fetch, new_state(recipe, 1000, 100))
    assert [r for _, r in calls] == list(range(rounds + 1))
    # 5 missing at a keep rate of 11/16: ceil(5 * 16 / 11) = 8 groups; then the rate falls
    assert calls[:2] == [(16, 0), (8, 1)]
    assert len(kept) == 11 and stats["groups_kept"] == 11 and stats["short_batch"] == 1
    assert all(len(set(g.correct)) == 2 for g in kept)      # only mixed groups are trained
    plural = "s" if rounds != 1 else ""
    assert f"kept 11 of the 16 groups a step needs after {rounds} refill round{plural} " \
           f"(filter.max_refill_rounds = {rounds})" in stats["short_batch_reason"]
    assert "Raise filter.max_refill_rounds" in stats["short_batch_reason"]


def test_collect_batch_refill_fills_the_batch_in_the_last_allowed_round():
    from scalectl.rl.batches.collect import collect_batch
    from scalectl.rl.loop import new_state

    recipe = _dapo(1)
    fetch, calls = _scripted_fetch([11, 5])
    kept, stats = collect_batch(recipe, fetch, new_state(recipe, 1000, 100))
    assert calls == [(16, 0), (8, 1)]
    assert len(kept) == 16 and stats["groups_kept"] == 16
    assert stats["zero_variance_share"] == (5 + 3) / 24


def test_the_pool_warning_starts_at_half_the_pool_retired():
    from scalectl.rl.batches.filters import pool_warning

    assert pool_warning(1999, 4000) is None
    warning = pool_warning(2000, 4000)
    assert warning.startswith("2000 of the 4000 training prompts are retired")
    assert pool_warning(3, 4, share=0.8) is None and pool_warning(4, 4, share=0.8) is not None
    for bad in ((5, 4), (-1, 4), (0, 0)):
        with pytest.raises(ValueError):
            pool_warning(*bad)
