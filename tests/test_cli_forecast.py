"""`scalectl forecast` on a real SQLite store: pass rates at compute not yet spent, the compute to
a target, crossings, the figure, and the refusals (exit 2, the store unchanged)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from scipy.optimize import brentq
from typer.testing import CliRunner

from conftest import run_cli
from scalectl.cli import app
from scalectl.curve import sigmoid
from scalectl.science.forecast import compute_to_reach
from scalectl.store.database import Store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def add_run(store, name, A, B, c_mid, seed, sd=0.004, reach=4.0, n=41, recipe_hash=None, axes=("gpu_hours",)):
    run_id = store.create_run(name, hardware="H100", recipe_hash=recipe_hash or f"h-{name}", seed=seed)
    x = np.linspace(0.0, reach * c_mid, n)
    y = sigmoid(x, A, B, c_mid, 0.3) + np.random.default_rng(seed).normal(0, sd, x.size)
    points = []
    for i, (c, p) in enumerate(zip(x, y)):
        point = {"step": 10 * i, "pass_rate": float(p), "truncation_rate": 0.01}
        if "gpu_hours" in axes:
            point["gpu_hours"] = float(c)
        points.append(point)
    store.add_points(run_id, points)
    return run_id


@pytest.fixture
def db(db_path):
    with Store.open(db_path) as store:
        # the fast run has the lower ceiling: it leads early and is overtaken
        add_run(store, "fast", 0.60, 1.6, 500.0, seed=1, reach=6.0)
        add_run(store, "slow", 0.66, 1.6, 1500.0, seed=2, reach=2.0)
        add_run(store, "seed0", 0.62, 1.5, 1000.0, seed=3, recipe_hash="same")
        add_run(store, "seed1", 0.62, 1.5, 1000.0, seed=4, recipe_hash="same")
        add_run(store, "early", 0.62, 1.5, 1000.0, seed=5, reach=0.6)       # far from its bend
        add_run(store, "steps-only", 0.62, 1.5, 1000.0, seed=6, axes=())
    return db_path


def cli(db, *args):
    return CliRunner().invoke(app, [*args, "--db", str(db)])


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_forecast_json_gives_the_curve_its_band_parts_and_the_compute_to_a_target(db):
    res = cli(db, "forecast", "seed0", "--at", "2x", "--at", "20000", "--target", "0.6", "--target", "0.7",
              "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    run = data["runs"]["seed0"]
    fit = run["fit"]
    assert run["last"] == 4000.0 and data["axis"] == "gpu_hours"
    assert fit["A"] == pytest.approx(0.62, abs=0.01)
    at = {p["compute"]: p for p in run["at"]}
    assert sorted(at) == [8000.0, 20000.0]
    for c, p in at.items():
        assert p["pass_rate"] == pytest.approx(float(sigmoid(c, fit["A"], fit["B"], fit["C_mid"], fit["R0"])),
                                               rel=1e-9)
        lo, hi = p["band"]
        assert lo < p["parts"]["fit"][0] <= p["pass_rate"] <= p["parts"]["fit"][1] < hi
        assert p["parts"]["drift_sd"] == 0.01 and p["parts"]["noise_sd"] > 0
        # the true curve lies within the band
        assert lo < float(sigmoid(c, 0.62, 1.5, 1000.0, 0.3)) < hi
    t60, t70 = run["targets"]
    assert t60["reachable"] and t60["compute"] == pytest.approx(
        float(compute_to_reach(0.6, fit["A"], fit["B"], fit["C_mid"], fit["R0"])), rel=1e-9)
    assert t60["interval"][0] <= t60["compute"] <= t60["interval"][1]
    assert not t70["reachable"] and t70["compute"] is None and t70["p_ceiling_below"] == 1.0
    assert data["crossings"] == []


def test_forecast_of_pooled_seeds_fits_their_points_together(db):
    one = json.loads(cli(db, "forecast", "seed0", "--json").stdout)["runs"]["seed0"]["fit"]
    res = cli(db, "forecast", "seed0", "seed1", "--pool", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    (name, run), = data["runs"].items()
    assert name == "seed0 + seed1" and data["pooled"]
    assert run["fit"]["n_points"] == 2 * one["n_points"]
    a_one, a_two = one["intervals"]["A"], run["fit"]["intervals"]["A"]
    assert a_two[1] - a_two[0] < a_one[1] - a_one[0]       # twice the points: a narrower ceiling
    res = cli(db, "forecast", "seed0", "fast", "--pool")
    assert res.exit_code == 2 and "are not seeds of one recipe (seed0: recipe same, fast: recipe h-fast;" in res.output


def test_forecast_names_the_crossing_of_a_fast_run_with_a_lower_ceiling(db, tmp_path):
    png = tmp_path / "forecast.png"
    proc = run_cli("forecast", "fast", "slow", "--horizon", "30000", "--target", "0.62", "--plot", str(png),
                   db=db, check=True)
    assert png.read_bytes()[:8] == PNG_MAGIC
    text = proc.stdout
    assert "crossings from 3,000 GPU-hours (the compute every run reached) up to 30,000:" in text
    line = next(ln for ln in text.splitlines() if "fast and slow cross at" in ln)
    assert line.endswith("fast leads before, slow after")
    res = cli(db, "forecast", "fast", "slow", "--horizon", "30000", "--json")
    (c,) = json.loads(res.stdout)["crossings"]
    lo, hi = c["interval"]
    # the true curves (A 0.60 at C_mid 500 vs A 0.66 at C_mid 1500, B 1.6, R0 0.3) cross past both
    # runs' last points (3,000), where Brent's method on the true curves puts it (about 3,550)
    truth = brentq(lambda x: float(sigmoid(x, 0.60, 1.6, 500.0, 0.3) - sigmoid(x, 0.66, 1.6, 1500.0, 0.3)),
                   1000.0, 1e5)
    assert 3000 < lo < truth < hi and c["probability"] > 0.9


def test_forecast_refuses_an_unidentified_ceiling_unless_asked_and_then_flags_every_number(db):
    before = digest(db)
    res = cli(db, "forecast", "early")
    assert res.exit_code == 2 and "ceiling is not identified" in res.output and "--allow-unidentified" in res.output
    res = cli(db, "forecast", "early", "--allow-unidentified", "--target", "0.5")
    assert res.exit_code == 0, res.output
    numbers = [ln for ln in res.stdout.splitlines() if ln.startswith("  ")]
    assert len(numbers) == 4 and all("[flags: " in ln for ln in numbers)
    assert digest(db) == before                                  # a forecast stores nothing


@pytest.mark.parametrize("args, match", [
    (("seed0", "--horizon", "1000"), "--horizon 1000 (1000) is not beyond the last point at 4000"),
    (("seed0", "--horizon", "0.5x"), "--horizon 0.5x (2000) is not beyond the last point at 4000"),
    (("seed0", "--at", "-5"), "--at -5 must be a finite compute > 0 (given -5)"),
    (("seed0", "--at", "-2x"), "--at -2x must be a finite compute > 0 (given -8000)"),
    (("seed0", "--at", "inf"), "--at inf must be a finite compute > 0 (given inf)"),
    (("seed0", "--at", "3000"), "--at 3000 (3000) is not beyond the last point at 4000"),
    (("seed0", "--at", "soon"), "--at 'soon' is neither"),
    (("seed0", "--target", "1.2"), "--target 1.2 is not a pass rate strictly between 0 and 1"),
    (("seed0", "--target", "0"), "--target 0 is not a pass rate"),
    (("seed0", "steps-only"), "different axes"),
    (("seed0", "--pool"), "--pool needs two or more runs"),
    (("seed0", "--bootstrap", "0"), "--bootstrap must be > 0"),
    (("nosuchrun",), "nosuchrun"),
])
def test_bad_input_is_refused_naming_the_argument_and_nothing_stored_changes(db, args, match):
    before = digest(db)
    res = cli(db, "forecast", *args)
    assert res.exit_code == 2, res.output
    assert match in res.output
    assert digest(db) == before


def test_a_run_with_too_few_points_is_refused(db_path):
    with Store.open(db_path) as store:
        add_run(store, "tiny", 0.6, 1.5, 1000.0, seed=1, n=4)
    res = cli(db_path, "forecast", "tiny")
    assert res.exit_code == 2 and "run tiny: the fit window" in res.output and "at least 4 are needed" in res.output


def test_compare_names_the_crossing_when_the_run_with_the_lower_ceiling_leads_now(db):
    res = cli(db, "compare", "fast", "slow", "seed0", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    pairs = {tuple(c["runs"]): c for c in data["crossings"]}
    # on the true curves, at 3,000 (where fast and slow end; seed0 ends at 4,000): fast (A 0.60) 0.584
    # leads slow (A 0.66) 0.571 and seed0 (A 0.62) 0.568; seed0 is behind slow: no crossing named
    true = {"fast": (0.60, 1.6, 500.0), "slow": (0.66, 1.6, 1500.0), "seed0": (0.62, 1.5, 1000.0)}
    at = {n: float(sigmoid(3000.0, A, B, c, 0.3)) for n, (A, B, c) in true.items()}
    assert at["fast"] > at["slow"] > at["seed0"]
    assert set(pairs) == {("fast", "slow"), ("fast", "seed0")}
    fast = pairs[("fast", "slow")]
    assert fast["start"] == 3000.0 and fast["compute"] > 3000.0 and fast["leader_after"] == "slow"
    text = cli(db, "compare", "fast", "slow").stdout
    assert "crossing: fast (lower ceiling) leads at 3,000, the compute both reached; slow overtakes it at" in text


def test_an_ablation_sentence_names_the_overtaking_of_a_variant_that_starts_faster(db):
    """The ablation report's sentence for a variant with the lower ceiling that leads the base where
    both end: the lower ceiling, and where the base's curve overtakes it."""
    from scalectl.ablation.analysis import gather

    manifest = {"name": "speed", "kind": "forward", "baseline": "slow", "margin": 0.02, "variants": [
        {"name": "slow", "is_base": True, "runs": ["slow"]},
        {"name": "fast", "lead": "Starting fast", "runs": ["fast"]}]}
    with Store.open(db) as store:
        result = gather(store, manifest, bootstrap=200)
    (c,) = result.comparison.crossings
    sentence = result.variant("fast").sentence
    assert sentence.startswith("Starting fast lowered the ceiling from 0.67 to 0.60")
    assert sentence.endswith(f"fast, with the lower ceiling, leads slow at 3,000, the compute both reached, and is "
                             f"overtaken at {c.compute:,.0f} (forecast): a faster start, not a higher ceiling.")
    assert result.variant("slow").sentence.startswith("slow is the baseline")


def test_forecast_names_the_crossing_ahead_not_one_the_points_already_show(db_path):
    """Curves that cross twice: the steep run (A 0.60) passes the shallow one (A 0.66, higher R0)
    near 1,000, inside both runs' points, and the shallow one overtakes it near 4,100, past their
    last points (3,000): the crossing named is the one ahead, where the true curves put it."""
    with Store.open(db_path) as store:
        for name, A, B, c_mid, r0, seed in (("steep", 0.60, 3.0, 800.0, 0.30, 1),
                                            ("shallow", 0.66, 1.0, 1000.0, 0.34, 2)):
            rid = store.create_run(name, hardware="H100", recipe_hash=f"h-{name}", seed=seed)
            x = np.linspace(0.0, 3000.0, 61)
            y = sigmoid(x, A, B, c_mid, r0) + np.random.default_rng(seed).normal(0, 0.003, x.size)
            store.add_points(rid, [{"step": 10 * i, "gpu_hours": float(c), "pass_rate": float(p)}
                                   for i, (c, p) in enumerate(zip(x, y))])
    truth = brentq(lambda c: float(sigmoid(c, 0.60, 3.0, 800.0, 0.30) - sigmoid(c, 0.66, 1.0, 1000.0, 0.34)),
                   3000.0, 1e5)
    res = cli(db_path, "forecast", "steep", "shallow", "--horizon", "30x", "--json")
    assert res.exit_code == 0, res.output
    (c,) = json.loads(res.stdout)["crossings"]
    assert c["start"] == 3000.0 and c["leader_before"] == "steep" and c["leader_after"] == "shallow"
    assert c["interval"][0] < truth < c["interval"][1] and 3000.0 < c["compute"]
