"""The evaluation point: what a run measures every ``eval.every_steps`` steps.

Produced by the training loop (:func:`scalectl.rl.loop.eval_point`), stored one
row per (run, step) by :class:`scalectl.store.database.Store` (its ``eval_points`` columns
are these fields plus ``run_id`` and ``time``), read back by fits and reports.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation of a run's policy on the held-out prompts.

    Attributes:
        step: optimiser steps taken before the evaluation.
        pass_rate: mean@k over the held-out prompts, in [0, 1].
        gpu_hours: devices x wall-clock hours of generation and training so far
            (device-hours on a CPU); flops: FLOPs so far (2N per generated or
            prefilled token, 6N per trained token); tokens: completion tokens
            generated so far; samples: completions generated so far.
        samples_per_prompt: k; correct_counts: correct completions per held-out
            prompt (for unbiased pass@k).
        truncation_rate: share of held-out completions that hit ``max_new_tokens``;
        mean_length: their mean length (tokens).
        train_reward, entropy, logprob_mismatch: the last training step's mean
            reward, mean token entropy (nats) and mean |log pi_train - log pi_gen|
            over completion tokens (None before the first step).
        retired_prompts: prompts retired as solved so far.
        wall_seconds: wall-clock seconds of generation and training so far.
        checker_errors: held-out completions the built-in answer checker could not judge
            (an internal error, a partial parse, a timeout: scored wrong), None when not counted.
    """

    step: int
    pass_rate: float
    gpu_hours: float | None = None
    flops: float | None = None
    tokens: int | None = None
    samples: int | None = None
    samples_per_prompt: int | None = None
    correct_counts: list[int] | None = field(default=None, hash=False)
    truncation_rate: float | None = None
    mean_length: float | None = None
    train_reward: float | None = None
    entropy: float | None = None
    logprob_mismatch: float | None = None
    retired_prompts: int | None = None
    wall_seconds: float | None = None
    checker_errors: int | None = None

    def to_dict(self) -> dict:
        """The point as a plain dict (every field, None included)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "EvalPoint":
        """A point from a dict with a subset of the fields.

        Raises:
            ValueError: a key that is not a field (names the key and the allowed ones).
        """
        unknown = set(data) - set(POINT_FIELDS)
        if unknown:
            raise ValueError(f"unknown eval point keys {sorted(unknown)}; allowed: {sorted(POINT_FIELDS)}")
        return cls(**data)


#: Field name -> Python type of every :class:`EvalPoint` field (the store's column types).
POINT_FIELDS: dict[str, type] = {
    "step": int, "gpu_hours": float, "flops": float, "tokens": int, "samples": int, "pass_rate": float,
    "samples_per_prompt": int, "correct_counts": str, "truncation_rate": float, "mean_length": float,
    "train_reward": float, "entropy": float, "logprob_mismatch": float, "retired_prompts": int,
    "wall_seconds": float, "checker_errors": int,
}
