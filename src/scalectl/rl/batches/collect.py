"""One training batch of scored groups: fetch, count, filter, refill.

How groups are fetched is the schedule's business (:mod:`scalectl.rl.schedule.modes`):
generated here by the run's own engine, or received from generator processes.
What is done with them is the same for every schedule: each fetched group is
counted (compute meter, prompt history), kept or dropped by the filters, and
dynamic sampling asks for more until the batch is full.  Every batch source checks
the tokens it hands to the trainer against its async mode's staleness bound
(:func:`check_staleness`).
"""

from __future__ import annotations

from scalectl.rl.train.batch import keep_groups
from scalectl.rl.batches.filters import DynamicSamplingExhausted, groups_to_refill
from scalectl.rl.reward.scoring import scorer_for
from scalectl.rl.rollout.groups import rollout_stats, score_groups
from scalectl.rl.rollout.sampling import SamplingParams


class StalenessError(RuntimeError):
    """A token older than the async mode allows reached the trainer (a scheduling bug, never expected)."""


def check_staleness(mode, version: int, groups: list, what: str = "a trained token") -> list[list[int]]:
    """Check every token of ``groups`` against ``mode``'s staleness bound for trainer version ``version``.

    Args:
        mode: the run's :class:`scalectl.recipe.async_modes.AsyncMode`.
        version: the trainer version that trains the groups.
        groups: scored groups (:class:`scalectl.rl.rollout.groups.Group`), each completion with the
            policy version of every token.
        what: the tokens' name in the error (``a token of prompt 7``).

    Returns:
        The token versions, one list per completion (for :func:`scalectl.rl.schedule.feeder.staleness_stats`).

    Raises:
        StalenessError: a token more than ``mode.staleness_bound`` versions behind ``version``; the
            message names the token's version, the trainer version and the bound.
    """
    versions = [c.versions for g in groups for c in g.completions]
    oldest = min((v for vs in versions for v in vs), default=version)
    if version - oldest > mode.staleness_bound:
        raise StalenessError(f"{what} has version {oldest}, {version - oldest} versions behind trainer version "
                             f"{version} (async.mode = {mode.describe()} allows at most {mode.staleness_bound})")
    return versions


def collect_batch(recipe, fetch, state) -> tuple[list, dict]:
    """One training batch of scored groups, filtered, with dynamic-sampling refills.

    Args:
        fetch: ``fetch(want, refill_round)`` returns ``want`` more scored groups and
            has counted them (:func:`count_groups`).
        state: the loop's :class:`~scalectl.rl.loop.LoopState`.

    Returns:
        (kept groups, rollout statistics over every fetched group).  A dynamic-sampling batch
        still short of ``batch.prompts_per_step`` groups after ``filter.max_refill_rounds``
        refills is trained as it is, with fewer groups (as the zero-variance filter trains
        without refills): its statistics carry ``short_batch`` 1 and ``short_batch_reason``,
        the :class:`~scalectl.rl.batches.filters.DynamicSamplingExhausted` text saying what to
        change.  Stopping the run instead (DAPO's reference code raises) would throw away a
        long run for one hard step.
    """
    P, filt = recipe.batch.prompts_per_step, recipe.filter
    kept, generated, want, rounds_done, short = [], [], P, 0, None
    while True:
        groups = fetch(want, rounds_done)      # round 0 is the step's own; 1.. are refills
        generated += groups
        kept += keep_groups(groups, filt.zero_variance or filt.dynamic_sampling)
        if not filt.dynamic_sampling:
            break
        try:
            want = groups_to_refill(len(kept), P, rounds_done, filt.max_refill_rounds,
                                    keep_rate=len(kept) / len(generated))
        except DynamicSamplingExhausted as exc:
            short = str(exc)
            break
        if want == 0:
            break
        rounds_done += 1
    if filt.dynamic_sampling:
        kept = kept[:P]
    stats = rollout_stats(generated)
    stats["groups_kept"] = len(kept)
    if short is not None:
        stats["short_batch"], stats["short_batch_reason"] = 1, short
    stats["retired_prompts"] = len(state.history.retired)
    return kept, stats


def count_groups(recipe, groups: list, state) -> None:
    """Add generated groups to the compute meter and (when retiring solved prompts) the prompt history."""
    G = recipe.batch.generations_per_prompt
    state.meter.add_generation(sum(len(c.prompt_ids) for g in groups for c in g.completions),
                               sum(len(c.token_ids) for g in groups for c in g.completions),
                               sum(len(g.completions) for g in groups))
    if recipe.filter.retire_solved:
        for g in groups:
            state.history.update(g.prompt_id, g.n_correct, G)


def generate_batch(recipe, engine, problems: list, state, seed: int) -> tuple[list, dict]:
    """One training batch of scored, filtered groups (dynamic-sampling refills included),
    generated here by ``engine`` with its current weights; see :func:`collect_batch`."""
    G, params, score = recipe.batch.generations_per_prompt, SamplingParams.for_training(recipe), scorer_for(recipe)

    def fetch(want: int, refill_round: int) -> list:
        retired = state.history.retired if recipe.filter.retire_solved else frozenset()
        ids = state.sampler.next(want, retired)
        raw = engine.generate([problems[i].prompt for i in ids], G, params, seed=seed * 1009 + refill_round)
        groups = score_groups(raw, problems, ids, recipe.length, score)
        count_groups(recipe, groups, state)
        return groups

    return collect_batch(recipe, fetch, state)
