"""Length control: DAPO's overlong reward shaping and the interruption length.

Recipe keys: ``length.control`` (``interrupt`` | ``penalty`` | ``none``), ``length.interrupt_min``,
``length.interrupt_max``, and the overlong window L_max / L_cache.
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, l_max: int, l_cache: int) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, Sec. 3.4, Eq. 13).

    R_length(y) =  0                              if |y| <= L_max - L_cache
                   ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                  -1                              if |y| > L_max

    This equals the form in docs/recipe-axes.md, clip((L_max - |y|)/L_cache - 1, -1, 0): the
    middle piece is the same line and reaches -1 exactly at |y| = L_max. DAPO adds it to
    the reward; which completions get it (docs/recipe-axes.md: the correct ones) is the caller's choice.

    Args:
        lengths: (N,) completion lengths in tokens.
        l_max: L_max in tokens (DAPO 20,480; ScaleRL 14k).
        l_cache: L_cache in tokens, the soft window before L_max (DAPO 4,096; ScaleRL 2k).

    Returns:
        (N,) float penalties in [-1, 0].

    Raises:
        ValueError: unless 0 < l_cache <= l_max.
    """
    if not 0 < l_cache <= l_max:
        raise ValueError(f"overlong penalty needs 0 < L_cache <= L_max; got L_cache={l_cache}, L_max={l_max}")
    return ((l_max - l_cache - lengths.float()) / l_cache).clamp(-1.0, 0.0)


def interrupt_lengths(n: int, lo: int, hi: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """n interruption lengths drawn uniformly from the integers in [lo, hi] (both included).

    ScaleRL (arXiv 2510.13786, Sec. 3, length interruption): when a completion reaches its
    drawn length, a fixed phrase closing the thinking section is appended (paper: 10k-12k
    thinking tokens).

    Returns:
        (n,) long tensor.

    Raises:
        ValueError: unless 0 < lo <= hi.
    """
    if not 0 < lo <= hi:
        raise ValueError(f"length.interrupt_min/interrupt_max need 0 < min <= max; got {lo}, {hi}")
    return torch.randint(lo, hi + 1, (n,), generator=generator)
