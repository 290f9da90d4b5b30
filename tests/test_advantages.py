"""Group advantages on constructed groups, values worked out by hand."""

import pytest
import torch

from scalectl.rl.train.advantages import group_advantages

# Three groups of G = 4, rows interleaved and ids not contiguous (0, 1, 7):
#   group 0: rewards (+1, +1, -1, -1): mean 0,    centred (1, 1, -1, -1),          population std 1
#   group 1: rewards (+1, -1, -1, -1): mean -0.5, centred (1.5, -0.5, -0.5, -0.5), var (2.25 + 3 * 0.25) / 4 = 0.75
#   group 7: rewards (+1, +1, +1, +1): mean 1,    centred 0,                       std 0
GROUPS = torch.tensor([0, 1, 7, 0, 1, 7, 0, 1, 7, 0, 1, 7])
REWARDS = torch.tensor([1.0, 1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0, 1.0, -1.0, -1.0, 1.0])
CENTRED = [1.0, 1.5, 0.0, 1.0, -0.5, 0.0, -1.0, -0.5, 0.0, -1.0, -0.5, 0.0]


def test_none_only_centres():
    assert group_advantages(REWARDS, GROUPS, "none").tolist() == CENTRED


def test_prompt_divides_by_group_population_std():
    # group 1: 1.5 / sqrt(0.75) = 1.7320508, -0.5 / sqrt(0.75) = -0.5773503; group 7 stays 0 (0 / eps)
    expected = [1.0, 1.7320508, 0.0, 1.0, -0.5773503, 0.0, -1.0, -0.5773503, 0.0, -1.0, -0.5773503, 0.0]
    torch.testing.assert_close(group_advantages(REWARDS, GROUPS, "prompt"), torch.tensor(expected), atol=1e-5, rtol=0)


def test_group_of_two_gives_plus_minus_one():
    adv = group_advantages(torch.tensor([-1.0, 1.0]), torch.tensor([3, 3]), "prompt")
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0]), atol=1e-5, rtol=0)


def test_batch_divides_by_std_of_all_centred_advantages():
    # sum of squares of CENTRED = 4 * 1 + (2.25 + 3 * 0.25) + 0 = 7, over 12 rows: std = sqrt(7/12) = 0.7637626
    # 1 / 0.7637626 = 1.3093073, 1.5 / 0.7637626 = 1.9639610, 0.5 / 0.7637626 = 0.6546537
    expected = [1.3093073, 1.9639610, 0.0, 1.3093073, -0.6546537, 0.0, -1.3093073, -0.6546537, 0.0, -1.3093073,
                -0.6546537, 0.0]
    torch.testing.assert_close(group_advantages(REWARDS, GROUPS, "batch"), torch.tensor(expected), atol=1e-5, rtol=0)


def test_integer_rewards_are_accepted():
    adv = group_advantages(torch.tensor([1, 0, 0, 0]), torch.tensor([0, 0, 0, 0]), "none")
    assert adv.tolist() == [0.75, -0.25, -0.25, -0.25]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="advantage.normalization = 'group' is not one of prompt, batch, none"):
        group_advantages(REWARDS, GROUPS, "group")
    with pytest.raises(ValueError, match="shape"):
        group_advantages(REWARDS, GROUPS[:3])


def test_a_group_of_equal_shaped_rewards_gets_advantage_exactly_zero():
    """16 correct completions of one length in DAPO's overlong window (L_max 200, L_cache 5, a
    cache that is not a power of two) all get reward 1 + (195 - 196) / 5 = 0.8 in float32, whose
    group mean in float32 is off by a rounding residue; divided by its own std (+ 1e-6) that
    residue became an advantage of -0.1065.  One distinct reward: advantage 0, exactly."""
    from scalectl.rl.rollout.length import overlong_penalty

    rewards = 1.0 + overlong_penalty(torch.full((16,), 196), 200, 5)
    assert rewards.dtype == torch.float32 and bool((rewards == rewards[0]).all())
    assert abs(rewards[0].item() - 0.8) < 2**-24 * 2
    groups = torch.zeros(16, dtype=torch.long)
    measured = {norm: group_advantages(rewards, groups, norm) for norm in ("prompt", "batch", "none")}
    print("\n" + ", ".join(f"{norm}: {adv.abs().max().item():.4g}" for norm, adv in measured.items()))
    for norm, adv in measured.items():
        assert adv.tolist() == [0.0] * 16, norm


@pytest.mark.parametrize("normalization", ["prompt", "batch", "none"])
def test_every_group_with_one_distinct_reward_has_advantage_zero(normalization):
    """Whatever the reward value and the group size, beside the groups of REWARDS (group 7 is
    constant too)."""
    from scalectl.rl.rollout.length import overlong_penalty

    g = torch.Generator().manual_seed(0)
    values = torch.cat([torch.rand(200, generator=g) * 4 - 2, 1.0 + overlong_penalty(torch.arange(180, 201), 200, 7),
                        torch.tensor([0.1, 0.3, 0.7, 1 / 3, -0.9, 1e-8, 123.456])])
    worst = 0.0
    for size in (1, 2, 3, 7, 16, 48):
        for value in values.tolist():
            rewards = torch.cat([torch.full((size,), value), REWARDS])
            groups = torch.cat([torch.full((size,), 99), GROUPS])
            adv = group_advantages(rewards, groups, normalization)
            worst = max(worst, adv[:size].abs().max().item(), adv[size:][GROUPS == 7].abs().max().item())
    print(f"\n{normalization}: largest |advantage| of a group with one distinct reward {worst:.4g}")
    assert worst == 0.0
