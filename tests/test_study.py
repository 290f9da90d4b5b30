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
