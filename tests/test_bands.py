"""Prediction bands on real runs: tiny runs made with the project (tests/data/real_runs.json;
the commands, commit and date that made them are recorded in the file), each extrapolated
from its first half as `scalectl extrapolate RUN --fraction 0.5` does it."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, run_cli
from scalectl.store.database import Store

FIXTURE = ROOT / "tests" / "data" / "real_runs.json"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def data() -> dict:
    return json.loads(FIXTURE.read_text())


def test_fixture_holds_at_least_six_real_runs_of_several_presets_and_seeds(data):
    made = data["made"]
    assert made["commands"] and all(c.startswith("scalectl run ") for c in made["commands"])
    assert len(made["commit"]) == 40 and made["date"]
    runs = data["runs"]
    assert len(runs) >= 6
    assert len({r["recipe_hash"] for r in runs}) >= 3
    assert len({(r["recipe_hash"], r["seed"]) for r in runs}) == len(runs)   # no run twice
    for r in runs:
        assert r["status"] == "completed"
        steps = [p["step"] for p in r["points"]]
        assert steps == sorted(steps) and steps[0] == 0 and len(steps) >= 11
        flops = [p["flops"] for p in r["points"]]
        assert flops[0] == 0 and all(b > a for a, b in zip(flops, flops[1:]))
        for p in r["points"]:
            # the stored pass rate is mean@k of the stored per-prompt counts
            assert p["pass_rate"] == pytest.approx(np.mean(p["correct_counts"]) / p["k"], abs=1e-9)


def test_the_testbeds_long_runs_are_whole_runs_of_one_recipe():
    """tests/data/testbed_long_runs.json: the default setup's ScaleRL runs extended to 2,000 steps
    (docs/fitting.md, "On real runs"): every evaluation point from step 0 to 2,000, each pass rate
    the mean@k of its stored per-prompt counts."""
    long = json.loads((ROOT / "tests" / "data" / "testbed_long_runs.json").read_text())
    assert len(long["made"]["commit"]) == 40 and long["made"]["commands"]
    runs = long["runs"]
    assert len(runs) >= 2 and len({r["recipe_hash"] for r in runs}) == 1 and len({r["seed"] for r in runs}) == len(runs)
    for r in runs:
        assert r["status"] == "completed" and r["fit"]["truncation_threshold"] == 0.4
        assert [p["step"] for p in r["points"]] == list(range(0, 2001, 10))
        for p in r["points"]:
            assert len(p["correct_counts"]) == 500 and p["k"] == 8
            assert p["pass_rate"] == pytest.approx(np.mean(p["correct_counts"]) / p["k"], abs=1e-9)


def test_the_fixture_writer_keeps_points_counts_and_their_standard_error(tmp_path):
    db = tmp_path / "s.db"
    with Store.open(db) as store:
        rid = store.create_run("r-s3", recipe={"name": "r", "fit": {"axis": "flops", "min_compute": 0}},
                               recipe_hash="abc", seed=3, status="completed")
        store.add_points(rid, [
            {"step": 0, "pass_rate": 0.5, "flops": 0.0, "gpu_hours": 0.0, "samples_per_prompt": 4,
             "correct_counts": [0, 4, 2, 2]},
            {"step": 20, "pass_rate": 0.75, "flops": 1e9, "gpu_hours": 0.1, "samples_per_prompt": 4,
             "correct_counts": [3, 3, 3, 3], "truncation_rate": 0.25}])
        store.create_run("empty", recipe={}, recipe_hash="def", seed=0)
    out = tmp_path / "f.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "band_fixture.py"), str(db), str(out),
                           "--command", "scalectl run r --seed 3", "--commit", "0" * 40,
                           "--date", "2026-12-01"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    f = json.loads(out.read_text())
    assert f["made"] == {"commands": ["scalectl run r --seed 3"], "commit": "0" * 40,
                         "date": "2026-12-01", "note": ""}
    [run] = f["runs"]                           # the run without points is left out
    assert (run["name"], run["recipe_hash"], run["seed"]) == ("r-s3", "abc", 3)
    assert run["fit"] == {"axis": "flops", "min_compute": 0}
    p0, p1 = run["points"]
    assert p0["correct_counts"] == [0, 4, 2, 2] and p1["truncation_rate"] == 0.25
    # sum p(1-p) / k / n^2: p = 0, 1, .5, .5 -> 0.5 / 4 / 16
    assert p0["se"] == pytest.approx(math.sqrt(0.5 / 4) / 4)
    # every prompt at 3/4: 4 * 3/16 / 4 / 16
    assert p1["se"] == pytest.approx(math.sqrt(0.75 / 4) / 4)
    assert len(out.read_text().splitlines()) < 30   # one line per point


def test_the_fixture_writer_takes_runs_from_several_stores_in_order(tmp_path):
    """Runs of stores of their own (one per run, as runs made side by side keep them) land in one
    fixture: those of DB first, then of each --also-db in turn."""
    dbs = []
    for name, seed in (("a-s1", 1), ("b-s0", 0), ("c-s2", 2)):
        db = tmp_path / f"{name}.db"
        with Store.open(db) as store:
            rid = store.create_run(name, recipe={"fit": {"axis": "flops"}}, recipe_hash=name[0] * 3, seed=seed,
                                   status="completed")
            store.add_points(rid, [{"step": 0, "pass_rate": 0.25, "flops": 0.0, "gpu_hours": 0.0,
                                    "samples_per_prompt": 2, "correct_counts": [1, 0]}])
        dbs.append(db)
    out = tmp_path / "f.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "band_fixture.py"), str(dbs[1]), str(out),
                           "--also-db", str(dbs[0]), "--also-db", str(dbs[2]), "--command", "scalectl run b",
                           "--commit", "1" * 40, "--date", "2026-12-06"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(out.read_text())["runs"]
    assert [(r["name"], r["recipe_hash"], r["seed"]) for r in runs] == [
        ("b-s0", "bbb", 0), ("a-s1", "aaa", 1), ("c-s2", "ccc", 2)]
    assert all(r["points"][0]["correct_counts"] == [1, 0] for r in runs)


def test_the_fixture_writer_tells_runs_of_one_name_apart_by_a_prefix_per_store(tmp_path):
    """Fresh clones' stores each hold a ``scalerl-s0``: without --prefix the writer refuses to
    write two runs under one name; with one prefix per store each keeps its store's prefix."""
    dbs = []
    for k, rate in enumerate((0.25, 0.5)):
        db = tmp_path / f"c{k}.db"
        with Store.open(db) as store:
            rid = store.create_run("scalerl-s0", recipe={"fit": {"axis": "flops"}}, recipe_hash="h", seed=0,
                                   status="completed")
            store.add_points(rid, [{"step": 0, "pass_rate": rate, "flops": 0.0, "gpu_hours": 0.0,
                                    "samples_per_prompt": 2, "correct_counts": [int(4 * rate), 0]}])
        dbs.append(db)
    out = tmp_path / "f.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "band_fixture.py"), str(dbs[0]), str(out), "--also-db", str(dbs[1]),
           "--command", "make run", "--commit", "2" * 40, "--date", "2026-12-07"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode != 0 and "share the names scalerl-s0" in proc.stderr and not out.exists()
    proc = subprocess.run(cmd + ["--prefix", "c1"], capture_output=True, text=True)
    assert proc.returncode != 0 and "one per store" in proc.stderr and not out.exists()
    proc = subprocess.run(cmd + ["--prefix", "c1", "--prefix", "c2"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(out.read_text())["runs"]
    assert [(r["name"], r["points"][0]["pass_rate"]) for r in runs] == [("c1-scalerl-s0", 0.25), ("c2-scalerl-s0", 0.5)]


def test_coverage_follows_the_extrapolate_command(data, tmp_path):
    """The coverage helper fits a run as `scalectl extrapolate` does (window, R0 weight, seed)."""
    run = data["runs"][0]
    db = tmp_path / "s.db"
    with Store.open(db) as store:
        rid = store.create_run(run["name"], recipe={"fit": run["fit"]}, recipe_hash=run["recipe_hash"],
                               seed=run["seed"], status="completed")
        store.add_points(rid, [{k: p[k] for k in ("step", "flops", "gpu_hours", "tokens", "pass_rate",
                                                  "truncation_rate", "correct_counts")}
                               | {"samples_per_prompt": p["k"]} for p in run["points"]])
    proc = run_cli("extrapolate", run["name"], "--fraction", "0.5", "--json", db=db, check=True)
    cli = json.loads(proc.stdout)
    mine = _script("band_coverage").coverage({"runs": [run]})["runs"][0]
    assert cli["share_in_band"] * mine["held_out"] == pytest.approx(mine["inside"])
    assert cli["mean_abs_error"] == pytest.approx(mine["mean_abs_error"], rel=1e-9)
    assert cli["fit"]["A"] == pytest.approx(mine["A"], rel=1e-9)


def test_coverage_with_a_setups_fit_section_follows_the_extrapolate_command(tmp_path):
    """``band_coverage.py --fit-setup tiny-cpu`` fits a run made before the setup's window and
    R0 rule as ``scalectl extrapolate`` fits the same points stored with the setup's ``[fit]``
    section; the run's own section gives another fit."""
    coverage = _script("band_coverage")
    fit = coverage.setup_fit("tiny-cpu")
    assert fit["r0"] == "fit" and fit["min_compute"] > 0
    long = json.loads((ROOT / "tests" / "data" / "testbed_default_runs.json").read_text())
    run = next(r for r in long["runs"] if r["name"] == "long-s0")
    assert run["fit"]["min_compute"] == 0 and "r0" not in run["fit"]
    db = tmp_path / "s.db"
    with Store.open(db) as store:
        rid = store.create_run(run["name"], recipe={"fit": fit}, recipe_hash=run["recipe_hash"],
                               seed=run["seed"], status="completed")
        store.add_points(rid, [{k: p[k] for k in ("step", "flops", "gpu_hours", "tokens", "pass_rate",
                                                  "truncation_rate", "correct_counts")}
                               | {"samples_per_prompt": p["k"]} for p in run["points"]])
    cli = json.loads(run_cli("extrapolate", run["name"], "--fraction", "0.5", "--bootstrap", "200", "--json",
                             db=db, check=True).stdout)
    mine = coverage.coverage({"runs": [run]}, bootstrap=200, fit=fit)["runs"][0]
    own = coverage.coverage({"runs": [run]}, bootstrap=200)["runs"][0]
    assert cli["fit"]["A"] == pytest.approx(mine["A"], rel=1e-9)
    assert cli["share_in_band"] * mine["held_out"] == pytest.approx(mine["inside"])
    assert cli["mean_abs_error"] == pytest.approx(mine["mean_abs_error"], rel=1e-9)
    assert abs(own["A"] - mine["A"]) > 0.01


def test_prediction_band_covers_at_least_85_percent_of_held_out_points(data):
    summary = _script("band_coverage").coverage(data)
    assert summary["held_out"] >= 30
    assert summary["coverage"] >= 0.85, (
        f"{summary['inside']}/{summary['held_out']} held-out points inside the 95% band: "
        + "; ".join(f"{r['run']} {r['inside']}/{r['held_out']}" for r in summary["runs"]))


def test_the_default_setups_long_runs_and_their_forecast_from_half_of_each():
    """tests/data/testbed_default_runs.json: three seeds of the default setup (level 3, lr 2e-4,
    a point every 15 steps), seed 0 extended to 2,000 steps and seeds 1 and 2 to 1,250
    (docs/study.md, "The testbed since 2026-12-07").  Whole runs of one recipe content, each pass
    rate the mean@k of its per-prompt counts; extrapolated from the first half of each, the
    band holds the points documented there (157 of 178) and the partial fits' ceilings lie
    above the whole runs' (the falling ceiling the study describes)."""
    long = json.loads((ROOT / "tests" / "data" / "testbed_default_runs.json").read_text())
    runs = {r["name"]: r for r in long["runs"]}
    assert sorted(runs) == ["long-s0", "long-s1", "long-s2"] and {r["seed"] for r in runs.values()} == {0, 1, 2}
    assert len(long["made"]["commit"]) == 40 and len(long["made"]["commands"]) == 3
    for r in runs.values():
        last = 2000 if r["name"] == "long-s0" else 1250
        assert r["status"] == "completed" and r["fit"]["axis"] == "flops"
        assert [p["step"] for p in r["points"]] == list(range(0, last + 1, 15)) + ([last] if last % 15 else [])
        for p in r["points"]:
            assert len(p["correct_counts"]) == 500 and p["k"] == 8
            assert p["pass_rate"] == pytest.approx(np.mean(p["correct_counts"]) / p["k"], abs=1e-9)
    assert runs["long-s1"]["recipe_hash"] == runs["long-s2"]["recipe_hash"] != runs["long-s0"]["recipe_hash"]
    summary = _script("band_coverage").coverage(long)
    assert (summary["inside"], summary["held_out"]) == (157, 178)
    whole = {"long-s0": 0.584, "long-s1": 0.595, "long-s2": 0.596}     # scalectl fit of each whole run
    assert all(r["A"] > whole[r["run"]] + 0.015 for r in summary["runs"])


def _fixture_fit(run: dict, until: int, section: dict, **kw):
    """The fit of a fixture run's points up to step ``until`` with a recipe ``fit`` section's
    window and R0 rule, as ``scalectl fit`` reads them (:func:`scalectl.science.fits.fit_window`,
    :func:`scalectl.science.fits.fit_r0`)."""
    from scalectl.curve import fit_sigmoid
    from scalectl.science.fits import fit_r0, fit_window, parse_r0

    pts = [p for p in run["points"] if p["step"] <= until]
    x = np.array([p["flops"] for p in pts])
    y = np.array([p["pass_rate"] for p in pts])
    return fit_sigmoid(x, y, min_compute=fit_window(section, "flops", x), r0=parse_r0(fit_r0(section)),
                       axis="flops", bootstrap=kw.pop("bootstrap", 0), **kw), x, y


def test_the_default_setups_window_and_r0_hold_the_ceiling_of_its_long_runs():
    """The default setup's fit rule (setups/tiny-cpu.toml: the window from about step 60, R0 a
    parameter of the curve, paper App. A.5) on tests/data/testbed_default_runs.json: seed 0's
    fitted ceiling stays within 0.01 from 750 to 2,000 steps where the former rule (R0 measured
    at step 0, the window from compute 0) let it fall by 0.029; the seeds' margin at the
    setup's budget (1,000 steps) is <= 0.025 with each A interval at most 0.04 wide (at 750
    steps, the budget until 2026-12-07, one was wider); every identified half-run forecast holds
    its held-out points in the band with a mean signed error and a ceiling within 0.01 of the
    whole run's."""
    from scalectl import presets
    from scalectl.recipe.load import read_toml
    from scalectl.science.extrapolate import extrapolate
    from scalectl.science.fits import fit_r0, fit_window, parse_r0
    from scalectl.science.margin import from_ceilings

    section = read_toml(presets.packaged("setups", "tiny-cpu"))["fit"]
    assert fit_r0(section) == "fit" and 1.44e12 < section["min_compute"] < 1.9e12   # steps 45 and 60
    runs = {r["name"]: r for r in json.loads((ROOT / "tests" / "data" / "testbed_default_runs.json").read_text())["runs"]}
    former = {"axis": "flops", "min_compute": 0}
    a_now = [_fixture_fit(runs["long-s0"], n, section)[0].A for n in (750, 1000, 1250, 2000)]
    a_former = [_fixture_fit(runs["long-s0"], n, former)[0].A for n in (750, 1000, 1250, 2000)]
    assert max(a_now) - min(a_now) < 0.01 < 0.02 < a_former[0] - a_former[-1]

    budget = read_toml(presets.packaged("setups", "tiny-cpu"))["budget"]["steps"]
    at_budget = [_fixture_fit(r, budget, section, bootstrap=1000)[0] for r in runs.values()]
    assert all(not f.flags for f in at_budget)
    widths = [np.subtract(*f.interval("A")[::-1]) for f in at_budget]
    assert max(widths) <= 0.04                     # each seed identifies its ceiling at the budget
    at_750 = [_fixture_fit(r, 750, section, bootstrap=1000)[0] for r in runs.values()]
    assert max(np.subtract(*f.interval("A")[::-1]) for f in at_750) > 0.04     # the former budget's did not
    margin = from_ceilings([f.A for f in at_budget], list(runs), standard_errors=[f.standard_error("A") for f in at_budget])
    assert margin.value <= 0.025

    identified = 0
    for r in runs.values():
        whole, x, y = _fixture_fit(r, 10**6, section)
        ex = extrapolate(x, y, fraction=0.5, min_compute=fit_window(section, "flops", x),
                         r0=parse_r0(fit_r0(section)), axis="flops", bootstrap=1000, seed=0)
        if ex.fit.flags:                   # refused by `scalectl forecast`: nothing to check
            continue
        identified += 1
        inside = (ex.heldout_pass_rate >= ex.band_lo) & (ex.heldout_pass_rate <= ex.band_hi)
        assert inside.mean() >= 0.9
        assert abs(np.mean(ex.heldout_pass_rate - ex.predicted)) <= 0.01
        assert abs(ex.fit.A - whole.A) <= 0.01
    assert identified >= 2


def test_fresh_clones_make_runs_identify_their_ceiling():
    """tests/data/testbed_make_runs.json: the default run (`make run`: ScaleRL, seed 0, the
    setup's budget) of fresh clones, one store each (docs/study.md, "The budget of 1,000 steps";
    machine, load and commits in the file).  Each is a whole run of the default's recipe, and
    each, fitted as `scalectl fit` fits it (its recipe's window and R0 rule, 1,000 resamples),
    identifies its ceiling: no flag and an A interval at most 0.04 wide, the testbed's target."""
    from scalectl import presets
    from scalectl.recipe.load import read_toml

    made = json.loads((ROOT / "tests" / "data" / "testbed_make_runs.json").read_text())
    assert len(made["made"]["commit"]) == 40 and made["made"]["commands"] == ["make run"]
    runs = made["runs"]
    setup = read_toml(presets.packaged("setups", "tiny-cpu"))
    assert len(runs) >= 4 and len({r["recipe_hash"] for r in runs}) == 1 and len({r["name"] for r in runs}) == len(runs)
    for r in runs:
        assert r["status"] == "completed" and r["seed"] == 0 and r["fit"] == setup["fit"]
        steps = [p["step"] for p in r["points"]]
        assert steps[0] == 0 and steps[-1] == setup["budget"]["steps"] and len(steps) >= 60
        for p in r["points"]:
            assert len(p["correct_counts"]) == 500 and p["k"] == 8
            assert p["pass_rate"] == pytest.approx(np.mean(p["correct_counts"]) / p["k"], abs=1e-9)
        fit = _fixture_fit(r, steps[-1], r["fit"], bootstrap=1000)[0]
        lo, hi = fit.interval("A")
        assert not fit.flags and hi - lo <= 0.04, (r["name"], fit.A, lo, hi, fit.flag_codes)
        assert 0.5 < fit.A < 0.65                   # below 1: the level-8 share is never solved
