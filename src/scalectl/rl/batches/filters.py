"""Prompt filters: zero-variance groups, dynamic sampling, retiring solved prompts, and the prompt order.

Recipe keys (``filter``): ``zero_variance``, ``dynamic_sampling`` (bounded by
``max_refill_rounds``), ``retire_solved`` (``retire_threshold``, ``retire_rule``).
Sources: DAPO (Yu et al. 2025, arXiv 2503.14476, Sec. 3.2, dynamic sampling);
ScaleRL (Khatri et al. 2025, arXiv 2510.13786, Sec. 3, zero-variance filtering and
No-Positive-Resampling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

RETIRE_RULES = ("latest", "cumulative")


# -- zero-variance groups -----------------------------------------------------------------------


def zero_variance_mask(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Keep mask (N,) bool: False for every completion of a group whose rewards are all equal.

    Such a group has advantage 0 everywhere and adds nothing but weight to the loss; the
    caller drops it from the batch (not replaced: the "effective batch"), before computing
    the aggregation weights. Equality is exact.

    Args:
        rewards: (N,) rewards.
        group_ids: (N,) long, the group of each completion.

    Raises:
        ValueError: shapes that are not (N,) and (N,).
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both have shape (N,); got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    r = rewards.detach().double()
    hi = torch.full((n_groups,), -math.inf, dtype=r.dtype).scatter_reduce(0, inv, r, "amax")
    lo = torch.full((n_groups,), math.inf, dtype=r.dtype).scatter_reduce(0, inv, r, "amin")
    return (hi > lo)[inv]


# -- dynamic sampling (DAPO) --------------------------------------------------------------------


class DynamicSamplingExhausted(RuntimeError):
    """Dynamic sampling used every allowed refill round and the batch is still short of groups."""

    def __init__(self, n_kept: int, n_target: int, max_refill_rounds: int, rounds_done: int | None = None):
        rounds_done = max_refill_rounds if rounds_done is None else rounds_done
        self.n_kept, self.n_target = n_kept, n_target
        self.max_refill_rounds, self.rounds_done = max_refill_rounds, rounds_done
        super().__init__(
            f"dynamic sampling kept {n_kept} of the {n_target} groups a step needs after "
            f"{rounds_done} refill round{'s' if rounds_done != 1 else ''} (filter.max_refill_rounds = "
            f"{max_refill_rounds}): almost every prompt is all-correct or all-wrong. Raise "
            "filter.max_refill_rounds, use a prompt set of mixed difficulty, or use zero_variance "
            "filtering without refill."
        )


def groups_to_refill(
    n_kept: int, n_target: int, refill_round: int, max_refill_rounds: int, keep_rate: float | None = None
) -> int:
    """How many more groups (prompts) to generate for a dynamic-sampling batch; 0 when it is full.

    Args:
        n_kept: groups kept so far (with non-zero reward variance).
        n_target: groups a step needs (``batch.prompts_per_step``).
        refill_round: refill rounds already done for this step (0 after the step's first
            generation round, before any refill); at most ``max_refill_rounds`` refills are
            allowed, so the call after the last allowed refill raises.
        max_refill_rounds: ``filter.max_refill_rounds``.
        keep_rate: share of groups kept so far, if known; the request is then scaled up to
            ceil(missing / keep_rate) so one round is likely to fill the batch.

    Raises:
        DynamicSamplingExhausted: groups are missing and ``refill_round >= max_refill_rounds``.
    """
    missing = max(0, n_target - n_kept)
    if missing == 0:
        return 0
    if refill_round >= max_refill_rounds:
        raise DynamicSamplingExhausted(n_kept, n_target, max_refill_rounds, refill_round)
    if keep_rate is not None and keep_rate > 0:
        return math.ceil(missing / keep_rate - 1e-9)  # 18 / 0.6 is 30.000000000000004 in floats
    return missing


# -- retire solved prompts (No-Positive-Resampling) -------------------------------------------


@dataclass
class PromptHistory:
    """Each prompt's pass-rate history, and the set of retired prompts.

    ScaleRL's No-Positive-Resampling (arXiv 2510.13786, Sec. 3): once a prompt's pass rate
    reaches ``threshold`` it is retired and never sampled again. The paper does not say
    which pass rate; ``rule`` chooses:

    - ``latest``: the pass rate of its latest appearance (one group) reaches the threshold;
    - ``cumulative``: sum of correct / sum of completions over all its appearances does.

    Retirement is final: results that arrive later (e.g. from in-flight generation) are
    recorded but do not bring a prompt back.
    """

    threshold: float = 0.9
    rule: str = "latest"
    history: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # prompt -> [(n_correct, n), ...]
    retired: set[int] = field(default_factory=set)

    def __post_init__(self):
        if self.rule not in RETIRE_RULES:
            raise ValueError(f"filter.retire_rule = {self.rule!r} is not one of {', '.join(RETIRE_RULES)}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"filter.retire_threshold = {self.threshold} must be in (0, 1]")

    def update(self, prompt_id: int, n_correct: int, n: int) -> bool:
        """Record one appearance (n completions, n_correct of them correct); return True if now retired.

        Raises:
            ValueError: n < 1 or n_correct outside [0, n].
        """
        if n < 1 or not 0 <= n_correct <= n:
            raise ValueError(
                f"prompt {prompt_id}: need 0 <= n_correct <= n and n >= 1; got n_correct={n_correct}, n={n}"
            )
        self.history.setdefault(int(prompt_id), []).append((int(n_correct), int(n)))
        if self.pass_rate(prompt_id) >= self.threshold:
            self.retired.add(int(prompt_id))
        return self.is_retired(prompt_id)

    def pass_rate(self, prompt_id: int) -> float:
        """The pass rate the rule looks at (latest or cumulative); NaN for a prompt never seen."""
        seen = self.history.get(int(prompt_id))
        if not seen:
            return math.nan
        if self.rule == "latest":
            correct, n = seen[-1]
        else:
            correct, n = sum(c for c, _ in seen), sum(k for _, k in seen)
        return correct / n

    def is_retired(self, prompt_id: int) -> bool:
        return int(prompt_id) in self.retired

    def to_dict(self) -> dict:
        """A JSON-serialisable copy (prompt ids as string keys, as JSON objects require)."""
        return {
            "threshold": self.threshold,
            "rule": self.rule,
            "history": {str(p): [list(x) for x in h] for p, h in self.history.items()},
            "retired": sorted(self.retired),
        }

    @classmethod
    def from_dict(cls, d: dict) -> PromptHistory:
        """Inverse of ``to_dict``."""
        return cls(
            threshold=d["threshold"],
            rule=d["rule"],
            history={int(p): [(int(c), int(n)) for c, n in h] for p, h in d["history"].items()},
            retired={int(p) for p in d["retired"]},
        )


# -- prompt order ----------------------------------------------------------------------------------


#: Share of the training pool retired by ``retire_solved`` past which a run is warned.
POOL_WARN_SHARE = 0.5


def pool_warning(retired: int, n_prompts: int, share: float = POOL_WARN_SHARE) -> str | None:
    """The warning for a training pool that retirement is emptying, or None.

    When ``retired`` of ``n_prompts`` training prompts (counts) reach ``share`` of the
    pool, the prompts left are mostly ones the policy cannot yet solve: steps then draw
    groups that are all wrong (zero variance) and the held-out pass rate can fall.  On
    the tiny setup (4,000 synthetic prompts) ScaleRL peaked at 0.67 near step 900 with
    2,633 retired and fell to 0.22 by step 2,340 with 3,862 retired, the training pass
    rate 0.  Retiring solved prompts is ScaleRL's No-Positive-Resampling (Khatri et al.
    2025, section 3), on a pool far larger than what a run retires.

    Raises:
        ValueError: n_prompts < 1, retired outside [0, n_prompts], or share outside (0, 1].
    """
    if n_prompts < 1 or not 0 <= retired <= n_prompts or not 0 < share <= 1:
        raise ValueError(f"need n_prompts >= 1, 0 <= retired <= n_prompts, 0 < share <= 1; "
                         f"got retired={retired}, n_prompts={n_prompts}, share={share}")
    if retired < share * n_prompts:
        return None
    return (f"{retired} of the {n_prompts} training prompts are retired (filter.retire_solved): the "
            "prompts left are mostly unsolved, the held-out pass rate may fall from here and the "
            "sigmoid fit would not describe it; a larger pool (data.train_size or the data source) "
            "keeps the run in the regime the fit assumes")


class AllPromptsRetired(RuntimeError):
    """Every prompt of the prompt set is retired: there is nothing left to sample."""


class PromptSampler:
    """Epochs of shuffled prompt indices, deterministic in (seed, epoch), skipping retired prompts.

    Epoch e visits the permutation ``numpy.random.default_rng([seed, e]).permutation(n_prompts)``;
    a batch may run across an epoch boundary. A prompt retired after its epoch's permutation was
    drawn is skipped when its turn comes. The whole state is (epoch, position), so
    ``state_dict``/``load_state_dict`` (with the same retired set) give a resumed run the same
    data order. When fewer than k prompts remain active, one call of ``next(k)`` can return a
    prompt twice: group ids should count groups, not prompts.
    """

    def __init__(self, n_prompts: int, seed: int):
        if n_prompts < 1:
            raise ValueError(f"the prompt set is empty (n_prompts = {n_prompts})")
        self.n_prompts, self.seed = int(n_prompts), int(seed)
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n_prompts)

    def next(self, k: int, retired: set[int] | frozenset[int] = frozenset()) -> list[int]:
        """The next k prompt indices that are not in ``retired``.

        Raises:
            AllPromptsRetired: every prompt index in [0, n_prompts) is retired.
        """
        if all(p in retired for p in range(self.n_prompts)):
            raise AllPromptsRetired(
                f"all {self.n_prompts} prompts are retired (pass rate reached filter.retire_threshold); "
                "raise the threshold, use a larger or harder prompt set, or stop the run"
            )
        out: list[int] = []
        while len(out) < k:
            if self.position == self.n_prompts:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            p = int(self._order[self.position])
            self.position += 1
            if p not in retired:
                out.append(p)
        return out

    def state_dict(self) -> dict:
        return {"n_prompts": self.n_prompts, "seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict``; ValueError if it belongs to another prompt set size."""
        if state["n_prompts"] != self.n_prompts:
            raise ValueError(
                f"sampler state is for {state['n_prompts']} prompts but this prompt set has {self.n_prompts}"
            )
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)
