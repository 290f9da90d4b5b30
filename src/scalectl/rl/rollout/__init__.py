"""Rollout engines: sample completions from the policy, with the generator's log-probs."""

from __future__ import annotations

from scalectl.rl.rollout.base import Completion, Interrupt, RolloutEngine
from scalectl.rl.rollout.sampling import SamplingParams

__all__ = ["Completion", "Interrupt", "RolloutEngine", "SamplingParams", "make_engine"]


def make_engine(recipe, model, tokenizer) -> RolloutEngine:
    """The rollout engine named by ``hardware.rollout_engine``, over ``model``.

    ``cpu``: :class:`~scalectl.rl.rollout.cpu.CPURolloutEngine` sharing ``model`` with the
    trainer (``update_weights(None, version)`` then only moves the version), with the
    LM head in float32 when ``precision.lm_head = "fp32"``, its decoding step compiled when
    ``hardware.compile``.  Both engines refuse prompts longer
    than ``length.max_prompt_tokens`` (:func:`~scalectl.rl.rollout.base.check_prompt_lengths`).

    ``vllm``: :class:`~scalectl.rl.rollout.vllm.VLLMRolloutEngine` holding its own copy
    of the weights (``update_weights(None, version)`` copies ``model``'s), see
    :func:`~scalectl.rl.rollout.vllm.engine_from_recipe`.

    Raises:
        VLLMNotInstalled: ``vllm`` without the vllm package installed (a UserError, ImportError
            and ValueError whose message says what to do).
        ValueError: an unknown engine.
    """
    name = recipe.hardware.rollout_engine
    if name == "cpu":
        from scalectl.rl.rollout.cpu import CPURolloutEngine

        return CPURolloutEngine(model, tokenizer, head_fp32=recipe.precision.lm_head == "fp32",
                                max_prompt_tokens=recipe.length.max_prompt_tokens,
                                kv_memory_mib=recipe.hardware.decode_memory_mib,
                                compile_step=getattr(recipe.hardware, "compile", False))
    if name == "vllm":
        from scalectl.rl.rollout.vllm import engine_from_recipe

        return engine_from_recipe(recipe, model, tokenizer)
    raise ValueError(f"hardware.rollout_engine = {name!r} is not one of: cpu, vllm")
