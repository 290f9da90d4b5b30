"""End to end on the embedded default setup: warm start, RL, points in SQLite, the pass rate climbs.

Slow (the warm start alone takes minutes on first use): run with `make test-slow`.
"""

from __future__ import annotations

import json

import pytest

from conftest import run_cli


@pytest.mark.slow
def test_rl_raises_the_held_out_pass_rate(tmp_path):
    db = tmp_path / "s.db"
    run_cli("run", "recipes/minimax.toml", "--runs-dir", str(tmp_path / "runs"), "--name", "climb",
            "--set", "async.mode=sync", "--set", "budget.steps=150", "--set", "eval.every_steps=50",
            db=db, check=True, timeout=1800)
    points = json.loads(run_cli("show", "climb", "--json", db=db, check=True).stdout)["points"]
    assert [p["step"] for p in points] == [0, 50, 100, 150]
    flops = [p["flops"] for p in points]
    assert flops == sorted(flops) and flops[0] == 0
    assert all(len(p["correct_counts"]) == 500 for p in points)
    # the warm start sits near 0.45 (setups/tiny-cpu.toml); 150 CISPO steps at lr 1e-4 move
    # it by well over the 0.02 margin
    assert 0.35 <= points[0]["pass_rate"] <= 0.55
    assert points[-1]["pass_rate"] >= points[0]["pass_rate"] + 0.08
