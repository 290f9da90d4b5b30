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
