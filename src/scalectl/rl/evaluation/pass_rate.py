"""Held-out evaluation: k samples per prompt, pass rate (mean@k) and friends.

docs/method.md, section 5: every N steps (and before the first step, which gives
R0) sample k completions for each held-out prompt with the current weights,
score each with the run's reward (:mod:`scalectl.rl.reward.scoring`: its ``correct``),
and store the mean as the pass rate, with the per-prompt correct counts so that unbiased pass@k (Chen et al. 2021, arXiv 2107.03374, eq. 1)
can be computed later for any k <= samples.
"""

from __future__ import annotations

from math import comb



#: Prompts per random stream of an evaluation: prompts ``[lo, lo + 64)`` are sampled with seed
#: ``seed + lo``, wherever and in whatever call they are sampled (the engines' ``seed_block``).
SEED_PROMPTS = 64

#: Prompts per engine call of an evaluation, a multiple of :data:`SEED_PROMPTS`: the default
#: setup's evaluation (500 x 8) is one call, which the CPU engine decodes in batches of whole
#: streams up to what its memory for keys and values holds (``hardware.decode_memory_mib``:
#: 1,024 rows at the default 192 MiB, 1.10x the rate of calls of 64 prompts on a quiet machine;
#: benchmarks/README.md, "Rows per decoding call"), with the samples calls of 64 prompts give.
CHUNK_PROMPTS = 512


def evaluation_chunks(n_prompts: int, chunk_prompts: int = CHUNK_PROMPTS) -> list[range]:
    """The held-out prompts' chunks, in order: ``range(lo, min(lo + chunk_prompts, n))``."""
    return [range(lo, min(lo + chunk_prompts, n_prompts)) for lo in range(0, n_prompts, chunk_prompts)]


def evaluate_chunk(engine, problems: list, chunk: range, params, *, samples_per_prompt: int, seed: int,
                   score, seed_prompts: int | None = SEED_PROMPTS) -> dict:
    """Sample and score one chunk of the held-out prompts (k completions each; prompts ``[lo, lo
    + seed_prompts)`` of it with seed ``seed + lo``, ``seed_prompts`` None: all with ``seed +
    chunk.start``; ``score`` as in :func:`evaluate`): the part of :func:`evaluate` one engine
    call makes, anywhere.

    Returns:
        ``start`` (the chunk's first prompt), ``correct_counts`` (one per prompt), ``truncated``,
        ``length_sum`` (tokens), ``completions``, ``checker_errors`` (completions the
        checker could not judge, ``Score.error``), and ``versions``: for every completion, in
        order, the sorted policy versions of its tokens (one version when its weights never
        changed while it was sampled; empty for a completion of no token).
    """
    counts, truncated, length_sum, total, versions, errors = [], 0, 0, 0, [], 0
    part = [problems[i] for i in chunk]
    groups = engine.generate([p.prompt for p in part], samples_per_prompt, params, seed=seed + chunk.start,
                             seed_block=seed_prompts)
    for prob, comps in zip(part, groups):
        scores = score.completions(comps, prob)
        counts.append(sum(s.correct for s in scores))
        errors += sum(bool(getattr(s, "error", None)) for s in scores)
        truncated += sum(c.finish_reason == "length" for c in comps)
        length_sum += sum(len(c.token_ids) for c in comps)
        total += len(comps)
        versions += [sorted(set(c.versions)) for c in comps]
    return {"start": chunk.start, "correct_counts": counts, "truncated": truncated, "length_sum": length_sum,
            "completions": total, "versions": versions, "checker_errors": errors}


def combine_chunks(parts: list[dict], samples_per_prompt: int) -> dict:
    """The evaluation's result from its chunks' (:func:`evaluate_chunk`), taken in prompt order.

    Returns:
        pass_rate (mean@k), samples_per_prompt, correct_counts (list, one per prompt),
        truncation_rate, mean_length (tokens), checker_errors: what :func:`evaluate` returns.

    Raises:
        ValueError: the chunks do not cover consecutive prompts from 0, or cover none.
    """
    parts = sorted(parts, key=lambda p: p["start"])
    counts, truncated, length_sum, total, errors = [], 0, 0, 0, 0
    for part in parts:
        if part["start"] != len(counts):
            raise ValueError(f"evaluation chunks: expected one starting at prompt {len(counts)}, got {part['start']}")
        counts += part["correct_counts"]
        truncated += part["truncated"]
        length_sum += part["length_sum"]
        total += part["completions"]
        errors += part.get("checker_errors", 0)
    if total == 0:
        raise ValueError("an evaluation of no completion")
    return {
        "pass_rate": sum(counts) / total,
        "samples_per_prompt": samples_per_prompt,
        "correct_counts": counts,
        "truncation_rate": truncated / total,
        "mean_length": length_sum / total,
        "checker_errors": errors,
    }


def evaluate(engine, problems: list, params, *, samples_per_prompt: int, seed: int, score,
             chunk_prompts: int = CHUNK_PROMPTS, seed_prompts: int | None = SEED_PROMPTS) -> dict:
    """Sample and score k completions per held-out prompt.

    Args:
        engine: a rollout engine (:class:`scalectl.rl.rollout.base.RolloutEngine`).
        problems: held-out problems (``prompt``, ``answer``).
        params: the :class:`~scalectl.rl.rollout.sampling.SamplingParams` of evaluation
            (:meth:`~scalectl.rl.rollout.sampling.SamplingParams.for_evaluation`); a
            completion that hits ``params.max_new_tokens`` counts as truncated.
        samples_per_prompt: k.
        seed: sampling seed (the same per step, so reruns are comparable).
        score: the run's reward, a :class:`~scalectl.rl.reward.scoring.Scorer`
            (:func:`scalectl.rl.reward.scoring.scorer_for`; ``score.completions`` scores the k
            completions of a prompt); a completion is counted correct when its
            ``Score.correct`` is true.
        chunk_prompts: prompts per engine call (the engine bounds its memory itself).
        seed_prompts: prompts per random stream (:data:`SEED_PROMPTS`); the streams, not the
            calls, decide the samples when ``chunk_prompts`` is a multiple of it.  None: one
            stream per call.

    Returns:
        pass_rate (mean@k), samples_per_prompt, correct_counts (list, one per
        prompt), truncation_rate, mean_length (tokens), checker_errors.

    Raises:
        RewardFunctionError: the run's reward function failed on a completion.
    """
    parts = [evaluate_chunk(engine, problems, chunk, params, samples_per_prompt=samples_per_prompt, seed=seed,
                            score=score, seed_prompts=seed_prompts)
             for chunk in evaluation_chunks(len(problems), chunk_prompts)]
    return combine_chunks(parts, samples_per_prompt)


def pass_at_k(correct_counts: list[int], n: int, k: int) -> float:
    """Unbiased pass@k averaged over prompts: 1 - C(n - c, k) / C(n, k)
    (Chen et al. 2021, eq. 1), with n samples per prompt and c correct.

    Raises:
        ValueError: k > n.
    """
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, have {n}")
    return sum(1.0 - comb(n - c, k) / comb(n, k) for c in correct_counts) / len(correct_counts)
