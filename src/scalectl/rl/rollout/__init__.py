"""Rollout engines: sample completions from the policy, with the generator's log-probs."""

from __future__ import annotations

from scalectl.rl.rollout.base import Completion, Interrupt, RolloutEngine

__all__ = ["Completion", "Interrupt", "RolloutEngine", "make_engine"]


def make_engine(recipe, model, tokenizer) -> RolloutEngine:
    """The rollout engine named by ``hardware.rollout_engine``, over ``model``.

    ``cpu``: :class:`~scalectl.rl.rollout.cpu.CPURolloutEngine` sharing ``model`` with the
    trainer (``update_weights(None, version)`` then only moves the version), with the
    LM head in float32 when ``precision.lm_head = "fp32"``.

    Raises:
        ValueError: an engine that is not available in this build.
    """
    name = recipe.hardware.rollout_engine
    if name == "cpu":
        from scalectl.rl.rollout.cpu import CPURolloutEngine

        return CPURolloutEngine(model, tokenizer, head_fp32=recipe.precision.lm_head == "fp32")
    raise ValueError(f"hardware.rollout_engine = {name!r} is not available here; available: cpu")
