"""The async modes: one schedule class per ``async.mode``, found by name."""

from __future__ import annotations

import typing

import pytest

from scalectl.errors import UserError
from scalectl.recipe import Async
from scalectl.rl.schedule import SCHEDULES, schedule_for


def test_every_recipe_mode_has_a_schedule_and_no_other():
    allowed = typing.get_args(Async.model_fields["mode"].annotation)
    assert set(allowed) == set(SCHEDULES)


@pytest.mark.parametrize("mode, k, bound, processes, word", [
    ("sync", 8, 0, False, "sync"),                 # k is ignored: one batch per weights
    ("ppo_off_policy", 8, 7, False, "ppo_off_policy-8"),
    ("pipeline", 8, 8, True, "pipeline-8"),
])
def test_schedules_declare_bound_and_processes(mode, k, bound, processes, word):
    s = schedule_for(Async(mode=mode, k=k))
    assert (s.staleness_bound, s.multi_process, s.describe()) == (bound, processes, word)


def test_unknown_mode_names_the_known_ones():
    with pytest.raises(UserError, match="async.mode = 'later' is not one of: sync, ppo_off_policy, pipeline"):
        schedule_for(Async.model_construct(mode="later", k=1))
