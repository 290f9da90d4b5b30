"""Held-out evaluation: k samples per prompt, pass rate (mean@k) and friends.

docs/method.md, section 5: every N steps (and before the first step, which gives
R0) sample k completions for each held-out prompt with the current weights,
score each with the run's reward (:mod:`scalectl.rl.reward.scoring`: its ``correct``),
and store the mean as the pass rate, with the per-prompt correct counts so that unbiased pass@k (Chen et al. 2021, arXiv 2107.03374, eq. 1)
can be computed later for any k <= samples.
"""

from __future__ import annotations

from math import comb


def evaluate(engine, problems: list, params, *, samples_per_prompt: int, seed: int, score,
             chunk_prompts: int = 64) -> dict:
    """Sample and score k completions per held-out prompt.

    Args:
        engine: a rollout engine (:class:`scalectl.rl.rollout.base.RolloutEngine`).
        problems: held-out problems (``prompt``, ``answer``).
        params: the :class:`~scalectl.rl.rollout.sampling.SamplingParams` of evaluation
            (:meth:`~scalectl.rl.rollout.sampling.SamplingParams.for_evaluation`); a
            completion that hits ``params.max_new_tokens`` counts as truncated.
        samples_per_prompt: k.
        seed: sampling seed (the same per step, so reruns are comparable).
        score: ``score(completion_text, problem)`` -> :class:`~scalectl.rl.reward.score.Score`,
            the run's reward (:func:`scalectl.rl.reward.scoring.scorer_for`); a completion is
            counted correct when its ``Score.correct`` is true.
        chunk_prompts: prompts per engine call (bounds memory).

    Returns:
        pass_rate (mean@k), samples_per_prompt, correct_counts (list, one per
        prompt), truncation_rate, mean_length (tokens).

    Raises:
        RewardFunctionError: the run's reward function failed on a completion.
    """
    counts, truncated, length_sum, total = [], 0, 0, 0
    for lo in range(0, len(problems), chunk_prompts):
        chunk = problems[lo:lo + chunk_prompts]
        groups = engine.generate([p.prompt for p in chunk], samples_per_prompt, params, seed=seed + lo)
        for prob, comps in zip(chunk, groups):
            counts.append(sum(score(c.text, prob).correct for c in comps))
            truncated += sum(c.finish_reason == "length" for c in comps)
            length_sum += sum(len(c.token_ids) for c in comps)
            total += len(comps)
    return {
        "pass_rate": sum(counts) / total,
        "samples_per_prompt": samples_per_prompt,
        "correct_counts": counts,
        "truncation_rate": truncated / total,
        "mean_length": length_sum / total,
    }


def pass_at_k(correct_counts: list[int], n: int, k: int) -> float:
    """Unbiased pass@k averaged over prompts: 1 - C(n - c, k) / C(n, k)
    (Chen et al. 2021, eq. 1), with n samples per prompt and c correct.

    Raises:
        ValueError: k > n.
    """
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, have {n}")
    return sum(1.0 - comb(n - c, k) / comb(n, k) for c in correct_counts) / len(correct_counts)
