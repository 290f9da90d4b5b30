"""DAPO overlong penalty at the boundary lengths, and interruption lengths."""

import pytest
import torch

from scalectl.rl.rollout.length import interrupt_lengths, overlong_penalty


def test_overlong_penalty_boundaries():
    # L_max = 20, L_cache = 4: free up to 16 tokens, then -1/4 per token, -1 at 20 and beyond
    lengths = torch.tensor([0, 15, 16, 17, 18, 19, 20, 21, 100])
    expected = [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0]
    assert overlong_penalty(lengths, l_max=20, l_cache=4).tolist() == expected


def test_overlong_penalty_paper_scale():
    # ScaleRL's L_max = 14,336 (14k), L_cache = 2,048: (12,288 - 13,312) / 2,048 = -0.5
    assert overlong_penalty(torch.tensor([12288, 13312]), 14336, 2048).tolist() == [0.0, -0.5]


def test_overlong_penalty_rejects_bad_window():
    with pytest.raises(ValueError, match="0 < L_cache <= L_max"):
        overlong_penalty(torch.tensor([1]), l_max=4, l_cache=8)
    with pytest.raises(ValueError, match="0 < L_cache <= L_max"):
        overlong_penalty(torch.tensor([1]), l_max=4, l_cache=0)


def test_interrupt_lengths_cover_the_closed_interval():
    draws = interrupt_lengths(3000, 10, 12, torch.Generator().manual_seed(0))
    assert draws.dtype == torch.long and draws.shape == (3000,)
    counts = torch.bincount(draws, minlength=13)[10:].tolist()
    assert sum(counts) == 3000  # nothing outside [10, 12]
    assert all(800 < c < 1200 for c in counts)  # ~1000 each; 200 is > 7 binomial standard deviations (~26)
    again = interrupt_lengths(3000, 10, 12, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


def test_interrupt_lengths_degenerate_and_bad():
    assert interrupt_lengths(3, 7, 7).tolist() == [7, 7, 7]
    with pytest.raises(ValueError, match="interrupt_min"):
        interrupt_lengths(3, 12, 10)
