"""Torch threads of a CPU run: every core a process is given, shared by a pipeline's processes."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from scalectl.recipe.schema import Hardware
from scalectl.rl.processes.threads import cores_given, cpu_threads


@pytest.fixture
def no_thread_env(monkeypatch):
    for var in ("SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)


def test_default_uses_every_core_given_split_by_processes(no_thread_env):
    cores = len(os.sched_getaffinity(0))
    assert cores_given() == cores
    assert cpu_threads(None, processes=1) == cores
    assert cpu_threads(None, processes=2) == max(1, cores // 2)
    assert cpu_threads(None, processes=cores + 5) == 1   # never zero threads


def test_explicit_threads_win_over_environment(monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert cpu_threads(7, processes=2) == 7
    assert cpu_threads(None, processes=2) == 3       # a Slurm task's own cores
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert cpu_threads(None, processes=2) == 5       # the environment's explicit cap
    monkeypatch.setenv("OMP_NUM_THREADS", "not-a-number")
    assert cpu_threads(None, processes=1) == cores_given()


def test_hardware_threads_bounds():
    assert Hardware(threads=2).threads == 2
    assert Hardware().threads is None
    for bad in (0, -1, 10_000):
        with pytest.raises(ValidationError, match="threads"):
            Hardware(threads=bad)


def test_threads_leave_the_content_hash_alone():
    from scalectl.recipe.load import load
    from conftest import ROOT

    base = load(ROOT / "recipes" / "minimax.toml", ROOT / "setups" / "tiny-cpu.toml")
    one = load(ROOT / "recipes" / "minimax.toml", ROOT / "setups" / "tiny-cpu.toml", ["hardware.threads=1"])
    assert one.hardware.threads == 1
    assert one.content_hash == base.content_hash
