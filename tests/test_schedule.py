"""The async modes: one schedule class per ``async.mode``, found by name."""

from __future__ import annotations

import typing

import pytest

from scalectl.errors import UserError
from scalectl.job.layout import one_process
from scalectl.recipe.schema import Async
from scalectl.rl.schedule.modes import SCHEDULES, schedule_for


def test_every_recipe_mode_has_a_schedule_and_no_other():
    allowed = typing.get_args(Async.model_fields["mode"].annotation)
    assert set(allowed) == set(SCHEDULES)


@pytest.mark.parametrize("mode, k, bound, processes, word", [
    ("sync", 8, 0, [False, True, True, True], "sync"),       # k is ignored: one batch per weights
    ("ppo_off_policy", 8, 7, [False, True, True, True], "ppo_off_policy-8"),
    ("pipeline", 8, 8, [True, True, True, True], "pipeline-8"),
])
def test_schedules_declare_bound_and_processes(mode, k, bound, processes, word):
    """One process only for sync and ppo_off_policy on 1 generator + 1 trainer; processes for
    (generators, trainers) = (2, 1), (1, 2), (64, 16) and in every pipeline."""
    s = schedule_for(Async(mode=mode, k=k))
    layouts = [(1, 1), (2, 1), (1, 2), (64, 16)]
    assert (s.staleness_bound, [s.in_processes(g, t) for g, t in layouts], s.describe()) == (bound, processes, word)
    # the dry run's layout check (which imports no torch) says the same
    assert [not one_process(mode, g, t) for g, t in layouts] == processes


def test_unknown_mode_names_the_known_ones():
    with pytest.raises(UserError, match="async.mode = 'later' is not one of: sync, ppo_off_policy, pipeline"):
        schedule_for(Async.model_construct(mode="later", k=1))
