"""``scalectl ablate --until-decided`` and ``--plan`` on the simulated setup: real
subprocesses, the local launcher, a real store; interrupted with SIGINT and resumed."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import time

import pytest

from conftest import ROOT, SCALECTL, run_cli
from scalectl.recipe.load import load


def _ablation(tmp_path, seconds_per_step: float = 0.0, *, name: str = "simab",
              variants: dict[str, float] | None = None) -> str:
    """An ablation file on the simulated setup: a base curve with A = 0.6 and one variant
    per ``variants`` entry (name -> its A), 100 steps per run."""
    common = f"B=2,C_mid=0.1,R0=0.3,hours_per_step=0.001,seconds_per_step={seconds_per_step:g}"
    arms = "".join(f"""
[[variants]]
name = "{arm}"
set = ["model.path='simulated:A={a:g},{common}'"]
""" for arm, a in (variants or {"down": 0.5, "up": 0.7}).items())
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""
name = "{name}"
kind = "variants"
base = "{ROOT / 'recipes/scalerl.toml'}"
setup = "{ROOT / 'setups/simulated.toml'}"
baseline = "base"
set = ["model.path='simulated:A=0.6,{common}'", "budget.steps=100"]

[[variants]]
name = "base"
{arms}""")
    return str(path)


def _stages(db) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT stage, variant, budget, seeds, action, verdict, created FROM ablation_stages "
                            "WHERE ablation = 'simab' ORDER BY stage, variant").fetchall()
    except sqlite3.OperationalError:      # the table is not there yet
        return []
    finally:
        conn.close()


def test_plan_from_the_simulated_base(tmp_path):
    proc = run_cli("ablate", _ablation(tmp_path), "--plan", "--json", db=tmp_path / "s.db", check=True)
    p = json.loads(proc.stdout)["power"]
    # 5 x C_mid / hours_per_step = 500 steps (a multiple of eval.every_steps = 10); 3 arms
    assert p["budget_steps"] == 500 and p["arms"] == 3 and p["reach"] == pytest.approx(5.0)
    assert p["device_hours"] == pytest.approx(3 * p["seeds"] * 500 * 0.001)
    assert p["source"].startswith("the simulated base curve")
    bad = run_cli("ablate", _ablation(tmp_path), "--until-decided", "--max-seeds", "0", db=tmp_path / "s.db")
    assert bad.returncode == 2 and "0 is out of range; allowed: 1..1,000" in " ".join(bad.stderr.replace("│", " ").split())


def test_plan_and_its_settings_from_python(tmp_path):
    """`ablate --plan` as library calls (scalectl.ablation.until_decided): prepare checks the
    settings as the command does and takes the simulated base's rate; power plans from the
    simulated base curve; --assume values are parsed or refused naming the keys."""
    from scalectl.ablation import read_ablation, until_decided
    from scalectl.errors import UserError

    spec = read_ablation(_ablation(tmp_path))
    db = str(tmp_path / "s.db")
    staged = until_decided.prepare(spec, db=db)
    assert (staged.initial, staged.limits.max_budget, staged.limits.max_seeds, staged.kind) == (100, 800, 6, "local")
    assert staged.rate == 0.001 and staged.limits.step_multiple == 10 and staged.level == 0.99
    p = until_decided.power(staged, {})
    assert p["budget_steps"] == 500 and p["arms"] == 3          # 5 x C_mid 0.1 / 0.001 device-hours per step
    assert p["device_hours"] == pytest.approx(3 * p["seeds"] * 500 * 0.001)
    assert not (tmp_path / "s.db").exists()                      # planning creates no store
    with pytest.raises(UserError, match="--max-budget 50 is below the first stage's budget 100 steps"):
        until_decided.prepare(spec, db=db, max_budget=50)
    assert until_decided.parse_assume(["C_mid=0.1,s_fit=0.004", "s_seed=0.01"]) == {
        "C_mid": 0.1, "s_fit": 0.004, "s_seed": 0.01}
    with pytest.raises(UserError, match="KEY one of: C_mid, compute_per_step, s_fit, s_seed"):
        until_decided.parse_assume(["B=2"])


@pytest.mark.slow
def test_until_decided_end_to_end(tmp_path):
    db = tmp_path / "s.db"
    proc = run_cli("ablate", _ablation(tmp_path), "--until-decided", "--bootstrap", "100", "--poll", "0.2",
                   "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "rep"), "--json",
                   db=db, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    verdicts = {v["variant"]: v["verdict"] for v in result["variants"]}
    assert verdicts == {"base": "baseline", "down": "lower ceiling", "up": "higher ceiling"}
    rows = _stages(db)
    assert [r[:4] for r in rows if r[0] == 0] == [(0, "base", 100, 1), (0, "down", 100, 1), (0, "up", 100, 1)]
    # every stage past 0 trains what the previous one decided; runs exist under the ablation's names
    conn = sqlite3.connect(db)
    runs = dict(conn.execute("SELECT name, status FROM runs").fetchall())
    last = max(r[0] for r in rows)
    budgets = {r[1]: (r[2], r[3]) for r in rows if r[0] == last}
    for variant, (budget, seeds) in budgets.items():
        for s in range(seeds):
            name = f"simab--{variant}--s{s}"
            assert runs[name] == "completed"
            top = conn.execute("SELECT MAX(step) FROM eval_points p JOIN runs r ON r.id = p.run_id "
                               "WHERE r.name = ?", [name]).fetchone()[0]
            assert top >= budget
    assert result["spent_hours"] <= result["fixed_hours"]
    text = (tmp_path / "rep" / "adaptive.md").read_text()
    assert "| up |" in text and "higher ceiling" in text and "device-hours" in text


@pytest.mark.slow   # 10-25 s: make test-slow (the default suite keeps under 10 minutes)
def test_until_decided_out_of_options_says_what_a_verdict_needs(tmp_path):
    """At 100 steps the curves reach 1 x C_mid (a verdict waits for 5 x) and --max-budget
    is 100: the variant stops undecided, the report says why and what a verdict needs
    (priced at the simulated 0.001 device-hours per step); the same command again
    trains nothing and still ends "out of options"; a larger --max-budget reopens it."""
    path = _ablation(tmp_path, name="short", variants={"near": 0.61})
    db = tmp_path / "s.db"
    args = ["ablate", str(path), "--until-decided", "--max-budget", "100", "--max-seeds", "1", "--bootstrap", "100",
            "--poll", "0.2", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]
    first = run_cli(*args, db=db, cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "1 stage(s), ended: out of options" in first.stdout
    assert "- near: undecided: ceiling of near not identified at --max-budget 100" in first.stdout
    conn = sqlite3.connect(db)
    fits = {v: json.loads(f) for v, f in conn.execute("SELECT variant, fit FROM ablation_stages WHERE stage = 0")}
    conn.close()
    # 5 x C_mid in steps: compute per step = the fit's last compute / 100 steps; rounded up to eval.every_steps
    steps = {v: 10 * math.ceil(5 * f["C_mid"] / (f["window"][1] / 100) / 10 - 1e-9) for v, f in fits.items()}
    hours = sum(n - 100 for n in steps.values()) * 0.001
    assert (f"near is undecided: a verdict needs both ceilings identified (5 x C_mid): about "
            f"{steps['near']:,} steps per run for near and {steps['base']:,} for base "
            f"(--max-budget {max(steps.values())}), about {hours:.4g} device-hours more") in first.stdout
    again = run_cli(*args, db=db, cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "resuming adaptive ablation short at stage 1" in again.stderr
    assert "1 stage(s), ended: out of options" in again.stdout and "near is undecided" in again.stdout
    assert "stage 1: training" not in again.stderr                         # nothing trained, no stage added
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT DISTINCT stage FROM ablation_stages").fetchall() == [(0,)]
    conn.close()
    assert json.loads((tmp_path / "rep" / "adaptive.json").read_text())["ended"] == "out of options"
    # a larger --max-budget reopens the variant stopped at the old one: stage 1 decides again
    # on the same runs (nothing to train), extends them, and stage 2 trains the extension
    args[args.index("--max-budget") + 1] = "800"
    more = run_cli(*args, db=db, cwd=tmp_path, timeout=600)
    assert more.returncode == 0, more.stderr
    assert "reopening near: stopped undecided, with something left to try under --max-budget 800" in more.stderr
    assert "stage 1: nothing to train, deciding again on base 100 steps x1, near 100 steps x1" in more.stderr
    assert "stage 2: training " in more.stderr
    conn = sqlite3.connect(db)
    stage1 = dict(conn.execute("SELECT variant, action FROM ablation_stages WHERE stage = 1").fetchall())
    budgets = dict(conn.execute("SELECT variant, budget FROM ablation_stages WHERE stage = 2").fetchall())
    top = conn.execute("SELECT MAX(step) FROM eval_points p JOIN runs r ON r.id = p.run_id "
                       "WHERE r.name = 'short--near--s0'").fetchone()[0]
    conn.close()
    assert stage1 == {"base": "extend", "near": "extend"}
    assert budgets["near"] > 100 and top >= budgets["near"]


@pytest.mark.slow
def test_until_decided_interrupted_then_resumed(tmp_path):
    db = tmp_path / "s.db"
    args = ["ablate", _ablation(tmp_path, seconds_per_step=0.05), "--until-decided", "--bootstrap", "100",
            "--poll", "0.2", "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]
    env = dict(os.environ, SCALECTL_DB=str(db), COLUMNS="200")
    # Ctrl-C's SIGINT, with its default action even when the tests run from a background shell
    first = subprocess.Popen([SCALECTL, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 600
    while not _stages(db):                         # wait for stage 0 to be recorded
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.5)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 130, err
    assert "run the same command again" in err
    before = _stages(db)
    stage0 = [r for r in before if r[0] == 0]
    second = subprocess.run([SCALECTL, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    assert f"resuming adaptive ablation simab at stage {max(r[0] for r in before) + 1}" in second.stderr
    after = _stages(db)
    assert [r for r in after if r[0] == 0] == stage0          # stage 0 was not decided again
    final = {r[1]: r[5] for r in after if r[0] == max(x[0] for x in after)}
    assert final == {"base": "baseline", "down": "lower ceiling", "up": "higher ceiling"}


@pytest.mark.slow
def test_plan_from_a_stored_base_whose_ceiling_is_not_identified_says_so(tmp_path):
    """A completed base run of 60 steps reaches 0.6 x C_mid: its fit does not identify A, so the
    plan built on it carries a warning naming the run and how to extend it (and --plan prints it)."""
    db = tmp_path / "s.db"
    common = "B=2,C_mid=0.1,R0=0.3,hours_per_step=0.001,seconds_per_step=0"
    run_cli("run", "recipes/scalerl.toml", "--setup", "setups/simulated.toml", "--name", "short-base",
            "--runs-dir", str(tmp_path / "runs"), "--set", f"model.path='simulated:A=0.6,{common}'",
            "--set", "budget.steps=60", db=db, check=True, timeout=600)
    p = json.loads(run_cli("ablate", _ablation(tmp_path), "--plan", "--json", db=db, check=True).stdout)["power"]
    assert p["source"] == "fit of stored run short-base (60 steps)"
    assert p["warning"].startswith("the fit of short-base does not identify its ceiling")
    assert "--resume short-base" in p["warning"]
    shown = run_cli("ablate", _ablation(tmp_path), "--plan", db=db, check=True)
    assert "warning: the fit of short-base does not identify its ceiling" in " ".join(shown.stderr.split())


def test_plan_from_a_stored_run_of_another_recipe_in_steps_hours_and_wall_clock(tmp_path):
    """No run of the base recipe (the leave-one-out of scalerl on tiny-cpu) is stored, only a run
    of another recipe: --plan names it and --from-run; with --from-run it plans from that run's fit
    and rates (0.001 GPU-hours and 2 s per step), in steps, device-hours and wall-clock, and says
    what its terms mean."""
    db = tmp_path / "s.db"
    steps = list(range(0, 501, 10))
    c = [0.001 * s for s in steps]
    r = [0.3 + 0.3 / (1 + (0.1 / x) ** 2) if x > 0 else 0.3 for x in c]
    from scalectl.store.database import Store

    with Store.open(db) as store:        # a run stored as the trainer stores one, wall-clock included
        rid = store.create_run("other-s0", hardware="cpu-2core")
        store.add_points(rid, [{"step": s, "gpu_hours": x, "pass_rate": y + 0.003 * math.sin(s), "wall_seconds": 2.0 * s}
                               for s, x, y in zip(steps, c, r)])
    missing = run_cli("ablate", "--leave-one-out", "--plan", db=db, cwd=tmp_path)
    assert missing.returncode == 2
    assert "plan from a stored run of a similar recipe with --from-run RUN" in missing.stderr
    assert "stored runs it could plan from: other-s0" in missing.stderr
    p = json.loads(run_cli("ablate", "--leave-one-out", "--plan", "--from-run", "other-s0", "--json", db=db,
                           cwd=tmp_path, check=True).stdout)["power"]
    assert p["source"] == "fit of stored run other-s0 (500 steps)" and p["axis"] == "gpu_hours"
    assert p["compute_per_step"] == pytest.approx(0.001, rel=1e-3)
    every = load("scalerl", "tiny-cpu").eval.every_steps      # the budget is a whole number of evaluations
    assert p["budget_steps"] == every * math.ceil(5 * p["C_mid"] / p["compute_per_step"] / every - 1e-9)
    assert p["seconds_per_step"] == pytest.approx(2.0) and p["parallel"] == 1
    assert p["device_hours"] == pytest.approx(8 * p["seeds"] * p["budget_steps"] * 0.001, rel=1e-3)
    assert p["wall_seconds"] == pytest.approx(8 * p["seeds"] * p["budget_steps"] * 2.0)
    assert {"arm", "s_fit", "s_seed", "dA half-width", "reach"} <= set(p["terms"])
    shown = run_cli("ablate", "--leave-one-out", "--plan", "--from-run", "other-s0", db=db, cwd=tmp_path,
                    check=True).stdout
    assert f"{8 * p['seeds']} runs, {8 * p['seeds'] * p['budget_steps']:,} steps: about" in shown
    assert "wall-clock about" in shown and "(2 s per step, 1 run(s) at a time: launcher.max_parallel)" in shown
    assert "\nwhere:\n  arm: the base or one variant" in shown and "  s_fit: the sd of A from one run's fit" in shown
    nowhere = run_cli("ablate", "--leave-one-out", "--plan", "--from-run", "nope", db=db, cwd=tmp_path)
    assert nowhere.returncode == 2 and "nope" in nowhere.stderr
