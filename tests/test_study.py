"""scripts/study.py end to end on the simulated setup: three ScaleRL seeds measure the
margin, the published recipes are judged with it, and a second call trains nothing new."""

from __future__ import annotations

import json
import sqlite3
import statistics
import subprocess
import sys

import pytest

from conftest import ROOT


def _study(tmp_path, *extra):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "study.py"), "--setup", "simulated",
                           "--budget-steps", "500", "--bootstrap", "100", "--out", "report", *extra],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
def test_study_measures_its_margin_judges_the_recipes_with_it_and_resumes(tmp_path):
    first = _study(tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    with sqlite3.connect(tmp_path / "scalectl.db") as db:
        runs = dict(db.execute("SELECT name, status FROM runs").fetchall())
    seeds = [f"study-scalerl-b500-s{s}" for s in range(3)]
    assert set(runs) == {*seeds, *(f"recipes--{r}--s0" for r in ("grpo", "dapo", "magistral", "minimax"))}
    assert set(runs.values()) == {"completed"}
    margin = json.loads((tmp_path / "report" / "margin.json").read_text())["margins"][0]
    assert margin["runs"] == seeds
    # the rule (docs/fitting.md): 2 x the sample sd of the three fitted ceilings
    assert margin["value"] == pytest.approx(2 * statistics.stdev(margin["ceilings"]), rel=1e-12)
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert f"{margin['value']:.4f}"[:5] in summary and "measured" in summary
    assert "margin auto" in first.stdout
    again = _study(tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert all(f"{name}: completed, reused" in again.stdout for name in seeds)
    assert "0 new" in again.stdout and "$ scalectl run" not in again.stdout


def _study_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("study", ROOT / "scripts" / "study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plan_prices_the_study_and_trains_nothing(tmp_path):
    """``--plan`` on a new folder: every run is new, at the setup's budget (1,000 steps): 3 x 1,000
    + 4 x 1,000 steps, priced at the measured default rates of the setup, and no run is stored."""
    study = _study_module()
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "study.py"), "--plan"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("new, 1000 steps to train") == 3
    rates = study.DEFAULT_SECONDS_PER_STEP["tiny-cpu"]
    minutes = (3000 * rates["scalerl"] + 1000 * sum(rates[r] for r in ("grpo", "dapo", "magistral", "minimax"))) / 60
    assert f"total: 7000 steps, about {minutes:.0f} min of wall-clock" in out.stdout
    if (tmp_path / "scalectl.db").exists():
        with sqlite3.connect(tmp_path / "scalectl.db") as db:
            assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_plan_takes_a_recipes_rate_from_its_completed_runs():
    """Seconds per step: the median over completed runs of the recipe (run names as the study
    and its ablation give them); running runs do not count; else the setup's default."""
    study = _study_module()
    runs = [{"name": "study-scalerl-b500-s0", "status": "completed", "last_step": 500,
             "started": "2026-12-02T10:00:00+00:00", "ended": "2026-12-02T10:05:00+00:00"},      # 0.6 s
            {"name": "study-scalerl-b500-s1", "status": "completed", "last_step": 500,
             "started": "2026-12-02T11:00:00+00:00", "ended": "2026-12-02T11:10:00+00:00"},      # 1.2 s
            {"name": "study-scalerl-b500-s2", "status": "completed", "last_step": 250,
             "started": "2026-12-02T12:00:00+00:00", "ended": "2026-12-02T12:05:00+00:00"},      # 1.2 s
            {"name": "study-scalerl-fixedlag-b500-s0", "status": "completed", "last_step": 500,    # another recipe
             "started": "2026-12-02T12:00:00+00:00", "ended": "2026-12-02T12:50:00+00:00"},
            {"name": "recipes--grpo--s0", "status": "running", "last_step": 100,
             "started": "2026-12-02T13:00:00+00:00", "ended": None}]
    rate = study.seconds_per_step(runs, "tiny-cpu")
    assert rate["scalerl"][0] == pytest.approx(1.2) and "3 completed" in rate["scalerl"][1]
    assert rate["grpo"][0] == study.DEFAULT_SECONDS_PER_STEP["tiny-cpu"]["grpo"]
    assert study.seconds_per_step(runs, "paper-8b").keys() == {"scalerl"}
