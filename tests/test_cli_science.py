"""`scalectl fit`, `compare` and `extrapolate` on a real SQLite store."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import run_cli
from scalectl.cli import app
from scalectl.curve import sigmoid
from scalectl.store.database import Store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def add_run(store, name, A, B, c_mid, seed, hardware="H100", sd=0.005, reach=5.0, recipe_hash=None,
            truncation=0.01):
    run_id = store.create_run(name, hardware=hardware, recipe_hash=recipe_hash or f"h-{name}")
    x = np.linspace(0.0, reach * c_mid, 61)
    y = sigmoid(x, A, B, c_mid, 0.3) + np.random.default_rng(seed).normal(0, sd, x.size)
    store.add_points(run_id, [
        {"step": 100 * i, "gpu_hours": float(c), "tokens": int(c * 1e6), "pass_rate": float(p),
         "truncation_rate": truncation} for i, (c, p) in enumerate(zip(x, y))])
    return run_id


@pytest.fixture
def db(db_path):
    with Store.open(db_path) as store:
        add_run(store, "scalerl", 0.61, 1.92, 2542, seed=1)
        add_run(store, "magistral", 0.535, 1.8, 2600, seed=2)
        add_run(store, "cispo", 0.612, 2.3, 2300, seed=3, sd=0.003, reach=6)
        add_run(store, "base", 0.60, 1.5, 2542, seed=4, sd=0.003, reach=6)
    return db_path


def cli(db, *args):
    result = CliRunner().invoke(app, [*args, "--db", str(db)])
    return result


def test_compare_json_gives_verdicts(db):
    res = cli(db, "compare", "scalerl", "magistral", "--baseline", "scalerl", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["baseline"] == "scalerl" and data["margin"] == 0.02
    rows = {r["name"]: r for r in data["rows"]}
    assert [r["name"] for r in data["rows"]] == ["scalerl", "magistral"]
    assert rows["magistral"]["verdict"] == "lower ceiling"
    assert rows["magistral"]["delta_A"] == pytest.approx(-0.075, abs=0.01)
    assert data["fits"]["scalerl"]["A"] == pytest.approx(0.61, abs=0.01)
    assert data["flags"] == []


def test_compare_tie_rule_and_plots_through_the_console_script(db, tmp_path):
    png, svg = tmp_path / "curves.png", tmp_path / "loo.svg"
    proc = run_cli("compare", "base", "cispo", "--baseline", "base", "--plot", str(png),
                   "--loo-plot", str(svg), "--json", db=db, check=True)
    data = json.loads(proc.stdout)
    row = next(r for r in data["rows"] if r["name"] == "cispo")
    assert row["verdict"] == "tie on ceiling, faster"
    assert row["B_shared"] > 1.9
    assert row["speed_interval"][0] <= row["speed_ratio"] <= row["speed_interval"][1] < 1
    assert png.read_bytes()[:8] == PNG_MAGIC and "<svg" in svg.read_text()
    assert data["plots"] == [str(png), str(svg)]


def test_fit_stores_and_reuses_until_points_change(db):
    first = json.loads(cli(db, "fit", "scalerl", "--json").stdout)
    assert first["fits"][0]["cached"] is False
    fit = first["fits"][0]["fit"]
    assert fit["A"] == pytest.approx(0.61, abs=0.01) and fit["intervals"]["A"][0] <= fit["A"]
    assert fit["window"][0] >= 1500                    # recipe-less run at paper scale: 1.5k
    again = json.loads(cli(db, "fit", "scalerl", "--json").stdout)
    assert again["fits"][0]["cached"] is True and again["fits"][0]["fit"] == fit
    with Store.open(db) as store:
        run = store.get_run("scalerl")
        store.add_point(run["id"], {"step": 6100, "gpu_hours": 13_000.0, "pass_rate": 0.2})
        key = first["fits"][0]["key"]
        assert store.get_fit(run["id"], key)[0] == fit
    changed = json.loads(cli(db, "fit", "scalerl", "--json").stdout)
    assert changed["fits"][0]["cached"] is False
    assert changed["fits"][0]["fit"]["n_points"] == fit["n_points"] + 1


def test_fit_table_shows_flags_and_seed_spread(db):
    with Store.open(db) as store:
        add_run(store, "short", 0.65, 1.7, 10909, seed=5, reach=0.5)
        add_run(store, "s1", 0.61, 1.9, 2542, seed=11, recipe_hash="same")
        add_run(store, "s2", 0.61, 1.9, 2542, seed=12, recipe_hash="same", truncation=0.2)
    res = cli(db, "fit", "short", "s1", "s2", "--min-compute", "500")
    assert res.exit_code == 0, res.output
    assert "ceiling_not_identified" in res.stdout and "extend the run" in res.stdout
    assert "truncation" in res.stdout
    assert "recipe same: 2 runs" in res.stdout
    data = json.loads(cli(db, "fit", "s1", "s2", "--json").stdout)
    spread = data["seed_spread"]["same"]["A"]
    a = [f["fit"]["A"] for f in data["fits"]]
    assert spread["mean"] == pytest.approx(np.mean(a)) and spread["n"] == 2


def test_extrapolate_json_and_plot(db, tmp_path):
    png = tmp_path / "ex.png"
    res = cli(db, "extrapolate", "scalerl", "--fraction", "0.5", "--plot", str(png), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["cut"] == pytest.approx(0.5 * 5 * 2542)
    assert data["mean_abs_error"] < 0.01 and data["share_in_band"] >= 0.8
    assert len(data["sensitivity"]["rows"]) == 4
    assert png.read_bytes()[:8] == PNG_MAGIC
    human = cli(db, "extrapolate", "scalerl", "--until", "7000")
    assert human.exit_code == 0 and "held out" in human.stdout and "sensitivity" in human.stdout


def test_tokens_axis_and_errors(db):
    data = json.loads(cli(db, "fit", "scalerl", "--axis", "tokens", "--json").stdout)
    assert data["fits"][0]["fit"]["axis"] == "tokens"
    assert data["fits"][0]["fit"]["C_mid"] == pytest.approx(2542e6, rel=0.1)
    res = cli(db, "fit", "scalerl", "--axis", "flops", "--json")       # a run without flops: fitted on what it has
    assert res.exit_code == 0 and json.loads(res.stdout)["fits"][0]["fit"]["axis"] == "gpu_hours"
    assert ("note: run scalerl has no flops values (asked for by --axis); fitted on gpu_hours, the axis it has"
            in res.stderr)
    res = cli(db, "compare", "scalerl", "--axis", "hours")
    assert res.exit_code == 2 and "--axis 'hours' is not one of" in res.stderr
    res = cli(db, "extrapolate", "scalerl")
    assert res.exit_code == 2 and "exactly one of --until" in res.stderr
    res = cli(db, "extrapolate", "scalerl", "--fraction", "1e-9")
    assert res.exit_code == 2 and "too short to fit; this run (61 points) can be fitted from --fraction" in " ".join(
        res.stderr.split())
    res = cli(db, "fit", "nope")
    assert res.exit_code == 2 and "no run 'nope'" in res.stderr
    res = cli(db, "compare", "scalerl", "magistral", "--baseline", "zzz")
    assert res.exit_code == 2 and "--baseline 'zzz' is not one of" in res.stderr
    res = cli(db, "fit", "scalerl", "--min-compute", "1e9")
    assert res.exit_code == 2 and "holds 0 points" in res.stderr


def test_compare_flags_mixed_hardware(db):
    with Store.open(db) as store:
        add_run(store, "gb200", 0.63, 1.9, 2000, seed=7, hardware="GB200")
    data = json.loads(cli(db, "compare", "--json").stdout)      # every run in the store
    assert len(data["rows"]) == 5 and data["baseline"] == "scalerl"
    assert [f["code"] for f in data["flags"]] == ["mixed_hardware"]


def test_compare_of_every_run_leaves_out_runs_that_cannot_be_fitted(db):
    with Store.open(db) as store:
        short = store.create_run("short", hardware="H100", recipe_hash="h-short")
        store.add_points(short, [{"step": s, "gpu_hours": 10.0 * s, "pass_rate": 0.3} for s in (0, 1, 2)])
    res = cli(db, "compare", "--bootstrap", "0", "--json")
    assert res.exit_code == 0, res.output
    assert sorted(r["name"] for r in json.loads(res.stdout)["rows"]) == ["base", "cispo", "magistral", "scalerl"]
    assert json.loads(res.stdout)["left_out"] == [{"run": "short", "reason": SHORT_REASON}]
    text = cli(db, "compare", "--bootstrap", "0")
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines()[-1] == f"left out: {SHORT_REASON}"


#: Why a run of 3 points (0, 10, 20 GPU-hours) cannot be fitted: its window starts at 1.5 % of
#: its last point, 0.3, so it holds 10 and 20; the point at 0 measures R0 and A, B, C_mid and
#: the noise need one point more than those two.
SHORT_REASON = ("run 'short': the fit window (compute >= 0.3) holds 2 points; at least 4 are needed to fit "
                "4 parameters (the 1 at compute 0 gives R0)")


def _stored_fits(db) -> dict[str, list[dict]]:
    """run name -> the fits the store holds for it, read with sqlite3 itself."""
    import sqlite3

    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT runs.name, fits.fit FROM fits JOIN runs ON runs.id = fits.run_id").fetchall()
    out: dict[str, list[dict]] = {}
    for name, fit in rows:
        out.setdefault(name, []).append(json.loads(fit))
    return out


def test_compare_of_named_runs_ranks_those_that_fit_and_lists_the_others_under_the_table(db):
    """Runs of known sigmoids (A 0.61, B 1.92, C_mid 2542 and A 0.535, B 1.8, C_mid 2600, 61 points
    to 5 x C_mid, noise sd 0.005) beside a run of 3 points and one of none: the two that fit are
    ranked, the other two named under the table with their reasons; exit 0."""
    with Store.open(db) as store:
        short = store.create_run("short", hardware="H100", recipe_hash="h-short")
        store.add_points(short, [{"step": s, "gpu_hours": 10.0 * s, "pass_rate": 0.3} for s in (0, 1, 2)])
        store.create_run("empty", hardware="H100", recipe_hash="h-empty")
    args = ("compare", "scalerl", "short", "magistral", "empty", "--baseline", "scalerl", "--bootstrap", "200")
    proc = run_cli(*args, db=db)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    table_end = max(i for i, line in enumerate(lines) if line.startswith("└"))
    assert [line.split("│")[2].strip() for line in lines[:table_end] if line.startswith("│")] == ["scalerl", "magistral"]
    assert lines[-2:] == [f"left out: {SHORT_REASON}", "left out: run 'empty' has no evaluation points yet"]
    assert not any("short" in line or "empty" in line for line in lines[:table_end])
    data = json.loads(run_cli(*args, "--json", db=db, check=True).stdout)
    assert [r["name"] for r in data["rows"]] == ["scalerl", "magistral"]
    assert next(r for r in data["rows"] if r["name"] == "magistral")["verdict"] == "lower ceiling"
    assert data["left_out"] == [{"run": "short", "reason": SHORT_REASON},
                                {"run": "empty", "reason": "run 'empty' has no evaluation points yet"}]
    stored = _stored_fits(db)
    assert sorted(stored) == ["magistral", "scalerl"]             # nothing stored for the runs left out
    assert stored["scalerl"][0]["A"] == pytest.approx(0.61, abs=0.01)
    assert stored["magistral"][0]["A"] == pytest.approx(0.535, abs=0.01)
    assert stored["scalerl"][0]["C_mid"] == pytest.approx(2542, rel=0.1)


def test_compare_with_fewer_than_two_runs_that_fit_is_an_error_naming_each_left_out(db):
    with Store.open(db) as store:
        short = store.create_run("short", hardware="H100", recipe_hash="h-short")
        store.add_points(short, [{"step": s, "gpu_hours": 10.0 * s, "pass_rate": 0.3} for s in (0, 1, 2)])
    one = run_cli("compare", "scalerl", "short", "--bootstrap", "0", db=db)
    assert one.returncode == 2 and one.stdout == ""
    assert one.stderr.splitlines() == [
        f"error: compare needs two runs that can be fitted; of 2 run(s) in {db}, 1 can (scalerl):",
        f"  left out: {SHORT_REASON}"]
    alone = run_cli("compare", "short", "--bootstrap", "0", db=db)
    assert alone.returncode == 2 and "1 run(s) in" in alone.stderr and ", 0 can (none):" in alone.stderr
    base = run_cli("compare", "scalerl", "short", "magistral", "--baseline", "short", "--bootstrap", "0", db=db)
    assert base.returncode == 2
    assert (f"error: --baseline 'short' cannot be fitted, so nothing can be judged against it: {SHORT_REASON}"
            in " ".join(base.stderr.split()))
    assert cli(db, "compare", "scalerl", "--bootstrap", "0").exit_code == 0     # one run, none left out: as before
    bad = cli(db, "compare", "scalerl", "short", "--method", "lsq")
    assert bad.exit_code == 2 and "--method 'lsq' is not one of: vp, grid" in bad.stderr


def test_show_names_device_hours_of_a_cpu_run_and_prints_zero_as_zero(db_path):
    """`show` heads the hours column by the run's device (CPU-hours for a CPU run,
    GPU-hours otherwise) and prints the compute-0 point's zeros as 0, not 0.000."""
    with Store.open(db_path) as store:
        for name, device in (("on-cpu", "cpu"), ("on-gpu", "cuda")):
            run = store.create_run(name, recipe={"hardware": {"device": device}})
            store.add_points(run, [{"step": 0, "gpu_hours": 0.0, "flops": 0.0, "pass_rate": 0.25},
                                   {"step": 10, "gpu_hours": 0.0125, "flops": 2.5e11, "pass_rate": 0.5}])
    result = CliRunner().invoke(app, ["show", "on-cpu", "--db", str(db_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "step" in line)
    assert "CPU-hours" in header and "GPU-hours" not in header
    first = next(line for line in result.output.splitlines() if "0.250" in line)
    cells = [c.strip() for c in first.split("│")[1:-1]]
    assert cells[:5] == ["0", "0", "0", "-", "0.250"]      # step, CPU-hours, FLOPs, tokens (none), pass rate
    assert "0.0125" in result.output
    gpu = CliRunner().invoke(app, ["show", "on-gpu", "--db", str(db_path)], env={"COLUMNS": "200"})
    assert "GPU-hours" in gpu.output


def test_show_says_when_the_checker_could_not_judge_held_out_completions(db_path):
    with Store.open(db_path) as store:
        run = store.create_run("errs", recipe={"hardware": {"device": "cpu"}})
        store.add_points(run, [{"step": 0, "pass_rate": 0.25, "checker_errors": 0},
                               {"step": 10, "pass_rate": 0.5, "checker_errors": 3},
                               {"step": 20, "pass_rate": 0.5, "checker_errors": 1}])
        clean = store.create_run("clean", recipe={})
        store.add_points(clean, [{"step": 0, "pass_rate": 0.25, "checker_errors": 0}])
    result = CliRunner().invoke(app, ["show", "errs", "--db", str(db_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "could not judge 4 held-out completion(s)" in result.output and "steps 10, 20)" in result.output
    quiet = CliRunner().invoke(app, ["show", "clean", "--db", str(db_path)], env={"COLUMNS": "200"})
    assert quiet.exit_code == 0 and "could not judge" not in quiet.output


def test_compare_says_a_ceiling_not_identified_once(db_path):
    """A run stopped at 0.9 x C_mid: its verdict's reason is its ceiling_not_identified flag, which
    compare printed a second time as the flag's own line; now each flag sentence appears once."""
    with Store.open(db_path) as store:
        add_run(store, "base", 0.60, 1.9, 2542, seed=4, sd=0.003, reach=6)
        add_run(store, "short", 0.60, 1.9, 2542, seed=5, sd=0.003, reach=0.9)
    res = cli(db_path, "compare", "base", "short", "--bootstrap", "200")
    assert res.exit_code == 0, res.output
    data = json.loads(cli(db_path, "compare", "base", "short", "--bootstrap", "200", "--json").stdout)
    flags = [f["message"] for f in data["fits"]["short"]["flags"] if f["code"] == "ceiling_not_identified"]
    assert flags and "not identified" in next(r["reason"] for r in data["rows"] if r["name"] == "short")
    text = " ".join(res.stdout.split())
    for message in flags:
        assert text.count(" ".join(message.split())) == 1, res.stdout


def test_extrapolate_on_a_short_run_names_the_fraction_that_fits(db_path):
    """The first 8 points (140 steps) of a real tiny run: `--fraction 0.5` leaves 3 points in the fit
    window, too few; the error names the smallest fraction that fits, which then works, and its
    sensitivity table, with one distinct window, says there is no spread rather than 'A spread 0.000'."""
    import re

    from conftest import ROOT

    real = json.loads((ROOT / "tests/data/real_runs.json").read_text())["runs"][0]
    with Store.open(db_path) as store:
        rid = store.create_run("short", hardware="cpu-2core")
        store.add_points(rid, [{k: p[k] for k in ("step", "gpu_hours", "pass_rate")} for p in real["points"][:8]])
    res = cli(db_path, "extrapolate", "short", "--fraction", "0.5", "--bootstrap", "100")
    assert res.exit_code == 2
    m = re.search(r"can be fitted from --fraction ([0-9.]+) \(--until [0-9.e-]+: (\d+) points fitted, (\d+) held out\)",
                  " ".join(res.output.split()))
    assert m, res.output
    fraction, fitted, held = float(m.group(1)), int(m.group(2)), int(m.group(3))
    assert fitted + held == 8 and held >= 1
    ok = cli(db_path, "extrapolate", "short", "--fraction", str(fraction), "--bootstrap", "100", "--json")
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.stdout)
    assert len(data["heldout"]) == held
    shown = cli(db_path, "extrapolate", "short", "--fraction", str(fraction), "--bootstrap", "100")
    assert [r["fit"] is not None for r in data["sensitivity"]["rows"]].count(True) == 1
    assert "(one window fitted: no spread to show)" in shown.output and "A spread 0.000" not in shown.output


def test_a_sensitivity_table_of_one_window_shows_no_spread():
    from scalectl.curve import fit_sigmoid
    from scalectl.present.tables import sensitivity_table
    from scalectl.science.extrapolate import Sensitivity, WindowFit

    x = np.linspace(0, 5000, 21)
    fit = fit_sigmoid(x, sigmoid(x, 0.6, 2.0, 1000, 0.3), bootstrap=0)
    one = Sensitivity((WindowFit((0.0, 5000.0), fit), WindowFit((2500.0, 5000.0), None, "too few points")))
    assert "(one window fitted: no spread to show)" in sensitivity_table(one).title
    two = Sensitivity((WindowFit((0.0, 5000.0), fit), WindowFit((0.0, 2500.0), fit)))
    assert "(A spread 0.000 over 2 windows)" in sensitivity_table(two).title


def test_extrapolate_flags_truncation_above_the_recipes_own_threshold(db_path):
    """A setup that cuts a share of its completions by design raises fit.truncation_threshold
    (tiny-cpu: 0.4); `extrapolate` flags the fitted part as `fit` does, above that threshold,
    not above the default 0.10.  The same points (held-out truncation 0.3) under a recipe without
    the key are flagged."""
    x = np.linspace(0.0, 400.0, 21)
    y = 0.3 + 0.4 / (1.0 + (150.0 / np.maximum(x, 1e-9)) ** 1.5)
    y[0] = 0.3
    points = [{"step": int(i * 10), "gpu_hours": float(c), "pass_rate": float(p), "truncation_rate": 0.3}
              for i, (c, p) in enumerate(zip(x, y))]
    with Store.open(db_path) as store:
        for name, section in (("own", {"axis": "gpu_hours", "truncation_threshold": 0.4}),
                              ("plain", {"axis": "gpu_hours"})):
            rid = store.create_run(name, recipe={"fit": section}, hardware="cpu-2core", status="completed")
            store.add_points(rid, points)
    flags = {}
    for name in ("own", "plain"):
        res = cli(db_path, "extrapolate", name, "--fraction", "0.5", "--bootstrap", "50", "--json")
        assert res.exit_code == 0, res.output
        flags[name] = [f["code"] for f in json.loads(res.stdout)["fit"]["flags"]]
        fitted = json.loads(cli(db_path, "fit", name, "--bootstrap", "50", "--json").stdout)["fits"][0]["fit"]
        assert ("truncation" in flags[name]) == ("truncation" in [f["code"] for f in fitted["flags"]])
    assert "truncation" not in flags["own"] and "truncation" in flags["plain"]


def test_the_recipes_fit_r0_decides_how_stored_runs_are_fitted(db_path):
    """fit.r0 = "fit" in a run's recipe fits R0 as a parameter of the curve (paper App. A.5), as
    ``--r0 fit`` does for a run whose recipe lacks the key: the same fit, R0 near the curve's own
    0.40 and not the step-0 pass rate 0.30 the early rise starts from; ``--r0`` overrides the
    recipe.  The key at its default (auto) leaves a recipe's hash alone; another value changes it;
    a bad one is refused naming the key and the allowed values."""
    from scalectl.errors import UserError
    from scalectl.recipe.load import load

    # an early rise the sigmoid does not follow: 0.30 at step 0, the curve (R0 0.40) from compute 40
    x = np.linspace(0.0, 1000.0, 51)
    y = 0.40 + (0.65 - 0.40) / (1.0 + (200.0 / np.maximum(x, 1e-9)) ** 1.6)
    y[0] = 0.30
    points = [{"step": int(i * 10), "gpu_hours": float(c), "pass_rate": float(p)} for i, (c, p) in enumerate(zip(x, y))]
    with Store.open(db_path) as store:
        for name, section in (("own", {"axis": "gpu_hours", "min_compute": 40.0, "r0": "fit"}),
                              ("plain", {"axis": "gpu_hours", "min_compute": 40.0})):
            rid = store.create_run(name, recipe={"fit": section}, hardware="cpu-2core", status="completed")
            store.add_points(rid, points)

    def fitted(*args):
        res = cli(db_path, "fit", *args, "--bootstrap", "0", "--json")
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["fits"][0]["fit"]

    own, plain, plain_fit, own_measured = fitted("own"), fitted("plain"), fitted("plain", "--r0", "fit"), \
        fitted("own", "--r0", "measured")
    assert own["r0_fitted"] and not plain["r0_fitted"] and not own_measured["r0_fitted"]
    assert (own["A"], own["B"], own["R0"]) == (plain_fit["A"], plain_fit["B"], plain_fit["R0"])
    assert own["R0"] == pytest.approx(0.40, abs=1e-3) and own["A"] == pytest.approx(0.65, abs=1e-3)
    assert own_measured["R0"] < 0.35 and abs(own_measured["A"] - 0.65) > 5e-3     # pulled by the early point
    res = cli(db_path, "extrapolate", "own", "--fraction", "0.6", "--bootstrap", "50", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["fit"]["r0_fitted"]

    base = load("recipes/scalerl.toml", "tiny-cpu").content_hash
    assert load("recipes/scalerl.toml", "tiny-cpu", ["fit.r0=fit"]).content_hash == base   # the setup's own
    assert load("recipes/scalerl.toml", "tiny-cpu", ["fit.r0=auto"]).content_hash != base
    plain = load("recipes/scalerl.toml", "simulated").content_hash
    assert load("recipes/scalerl.toml", "simulated", ["fit.r0=auto"]).content_hash == plain
    with pytest.raises(UserError, match=r"fit\.r0 = 'fitted' is not one of: auto, measured, fit"):
        load("recipes/scalerl.toml", "tiny-cpu", ["fit.r0=fitted"])
