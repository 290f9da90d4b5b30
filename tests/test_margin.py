"""The user's own margin: measured from seeds of one recipe in the store, with its interval
and rule; compare, ablate and report say which margin they use and where it came from."""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest
from conftest import ROOT, run_cli

from scalectl.curve import SigmoidFit, sigmoid
from scalectl.errors import UserError
from scalectl.science.fits import FitOptions
from scalectl.science.margin import (
    GIVEN,
    MEASURED,
    PAPER,
    for_ablation,
    from_ceilings,
    measure,
    measure_hash,
    parse_choice,
)
from scalectl.store.database import Store

#: Chi-square with 2 degrees of freedom is exponential with mean 2: its p-quantile is
#: -2 ln(1 - p), an independent check of scipy's chi2.ppf for 3 runs.
CHI2_2_975, CHI2_2_025 = -2 * math.log(0.025), -2 * math.log(0.975)


def test_margin_rule_by_hand():
    m = from_ceilings([0.60, 0.62, 0.64], ["a", "b", "c"], recipe_hash="h")
    assert (m.source, m.mean, m.runs, m.recipe_hash) == (MEASURED, pytest.approx(0.62), ("a", "b", "c"), "h")
    assert m.sd == pytest.approx(0.02, rel=1e-12)                     # sqrt((0.02^2 + 0 + 0.02^2) / 2)
    assert m.value == pytest.approx(0.04, rel=1e-12)                  # 2 x sd
    lo, hi = m.interval
    assert lo == pytest.approx(0.04 * math.sqrt(2 / CHI2_2_975), rel=1e-9)   # 0.0208
    assert hi == pytest.approx(0.04 * math.sqrt(2 / CHI2_2_025), rel=1e-9)   # 0.251
    assert m.paper_rule == pytest.approx(0.02)                        # largest deviation 0.02 -> 0.02
    # the paper's own three runs, within +-0.015 of their mean: its rule gives its 0.02
    assert from_ceilings([0.600, 0.615, 0.585], ["x", "y", "z"]).paper_rule == pytest.approx(0.02)
    five = from_ceilings([0.60, 0.62, 0.64, 0.61, 0.63], list("abcde"))
    assert five.interval[1] / five.interval[0] < hi / lo             # more seeds: a narrower interval
    with pytest.raises(UserError, match="at least 3 runs of one recipe; 2 given"):
        from_ceilings([0.6, 0.62], ["a", "b"])
    with pytest.raises(UserError, match="no spread to measure a margin"):
        from_ceilings([0.6, 0.6, 0.6], ["a", "b", "c"])


@pytest.mark.parametrize("text, error", [("0", "must be a finite number > 0 and < 1"),
                                         ("nan", "must be a finite number > 0 and < 1"),
                                         ("-0.1", "must be a finite number > 0 and < 1"),
                                         ("1.5", "must be a finite number > 0 and < 1"),
                                         ("wide", "is not a number or 'auto'")])
def test_margin_choices(text, error):
    assert parse_choice("auto") == "auto" and parse_choice("0.03") == 0.03 and parse_choice(None) is None
    with pytest.raises(UserError, match=error):
        parse_choice(text)


def _seed_store(path, ceilings, *, name="r", recipe_hash="h0", extra=()):
    """A store with one completed run per ceiling (the paper's batch-2048 curve with that A,
    noise sd 0.002, 60 points to 4 x C_mid), all of ``recipe_hash``; ``extra``: more (name,
    hash, A) runs."""
    rng = np.random.default_rng(7)
    x = np.linspace(0.0, 44_000.0, 60)
    with Store.open(path) as store:
        for run_name, digest, a in [(f"{name}{i}", recipe_hash, a) for i, a in enumerate(ceilings)] + list(extra):
            run_id = store.create_run(run_name, recipe_hash=digest, status="completed")
            y = sigmoid(x, a, 1.70, 10909.0, 0.3) + rng.normal(0, 0.002, x.size)
            store.add_points(run_id, [{"step": i, "gpu_hours": float(c), "pass_rate": float(p)}
                                      for i, (c, p) in enumerate(zip(x, y))])


def test_margin_measured_from_the_seeds_in_the_store(tmp_path):
    db = tmp_path / "s.db"
    _seed_store(db, [0.60, 0.62, 0.64], extra=[("short", "h1", 0.6)])
    with Store.open(db, create=False) as store:
        m = measure_hash(store, "h0", FitOptions(bootstrap=200))
        with pytest.raises(UserError, match="needs at least 3 completed runs of recipe h1; the store holds 1: short"):
            measure_hash(store, "h1", FitOptions(bootstrap=200))
    # each fit recovers its ceiling to about its noise (sd 0.002 over 60 points): the sd of the
    # three fitted ceilings is the 0.02 put in, to a few thousandths
    assert m.runs == ("r0", "r1", "r2") and m.sd == pytest.approx(0.02, abs=0.003)
    assert m.value == pytest.approx(2 * m.sd, rel=1e-12)
    out = run_cli("margin", "--db", str(db), "--bootstrap", "200", check=True).stdout
    assert f"recipe h0: 3 runs (r0, r1, r2): A {m.mean:.4f} mean, sd {m.sd:.4f}" in out
    assert f"margin {m.value:.3g} [{m.interval[0]:.3g}, {m.interval[1]:.3g}] (95% chi-square interval" in out
    assert "recipe h1: 1 completed run(s) (short); 2 more seed(s) measure a margin" in out
    data = json.loads(run_cli("margin", "r0", "r1", "r2", "--db", str(db), "--bootstrap", "200", "--json",
                              check=True).stdout)
    assert data["margins"][0]["value"] == pytest.approx(m.value, rel=1e-12)
    assert data["margins"][0]["rule"] == "2 x the sd of A over the runs"


def test_margin_splits_the_seeds_spread_into_the_fits_own_uncertainty_and_the_runs(tmp_path):
    # by hand: sd 0.02; the fits' errors 0.01, 0.02, 0.02 -> rms sqrt(3e-4) = 0.01732, the rest sqrt(4e-4 - 3e-4)
    m = from_ceilings([0.60, 0.62, 0.64], ["a", "b", "c"], standard_errors=[0.01, 0.02, 0.02])
    assert m.fit_sd == pytest.approx(math.sqrt(3e-4), rel=1e-12) and m.run_sd == pytest.approx(0.01, rel=1e-9)
    assert from_ceilings([0.60, 0.62, 0.64], ["a", "b", "c"], standard_errors=[0.03] * 3).run_sd == 0.0
    assert from_ceilings([0.60, 0.62, 0.64], ["a", "b", "c"]).run_sd is None
    with pytest.raises(ValueError, match="2 standard errors for 3 ceilings"):
        from_ceilings([0.60, 0.62, 0.64], ["a", "b", "c"], standard_errors=[0.01, 0.02])

    # a fit's own error: its A interval's half-width over the normal quantile (1.959964 at 95 %, 1.644854 at 90 %)
    fit = SigmoidFit(A=0.5, B=1.0, C_mid=1.0, R0=0.3, r0_fitted=True, window=(0.1, 5.0), n_points=20, rmse=0.01,
                     method="vp", intervals={"A": (0.50, 0.50 + 2 * 1.959964 * 0.01)})
    assert fit.standard_error("A") == pytest.approx(0.01, rel=1e-6)
    assert replace(fit, level=0.90).standard_error("A") == pytest.approx(0.01 * 1.959964 / 1.644854, rel=1e-6)
    assert replace(fit, intervals={}).standard_error("A") is None

    # from the store: the rms of the stored fits' errors, as `scalectl fit` reports their intervals
    db = tmp_path / "s.db"
    _seed_store(db, [0.60, 0.62, 0.64])
    data = json.loads(run_cli("margin", "r0", "r1", "r2", "--db", str(db), "--bootstrap", "200", "--json",
                              check=True).stdout)["margins"][0]
    fits = json.loads(run_cli("fit", "r0", "r1", "r2", "--db", str(db), "--bootstrap", "200", "--json",
                              check=True).stdout)["fits"]
    ses = [(f["fit"]["intervals"]["A"][1] - f["fit"]["intervals"]["A"][0]) / (2 * 1.959964) for f in fits]
    assert data["fit_sd"] == pytest.approx(math.sqrt(np.mean(np.square(ses))), rel=1e-5)
    assert data["run_sd"] == pytest.approx(math.sqrt(max(data["sd"] ** 2 - data["fit_sd"] ** 2, 0)), rel=1e-9)
    # ceilings 0.02 apart from fits with noise sd 0.002: the runs, not the fits, make the spread
    assert data["fit_sd"] < data["sd"] / 2
    out = run_cli("margin", "r0", "r1", "r2", "--db", str(db), "--bootstrap", "200", check=True).stdout
    share = data["fit_sd"] ** 2 / data["sd"] ** 2
    assert (f"of the ceilings' variance, {share:.0%} is the fits' own uncertainty on A (sd {data['fit_sd']:.4f}) and "
            f"{1 - share:.0%} the runs' (sd {data['run_sd']:.4f}): fits without error would give a margin of "
            f"{2 * data['run_sd']:.3g}") in out


def test_compare_says_which_margin_it_used(tmp_path):
    db = tmp_path / "s.db"
    _seed_store(db, [0.60, 0.62, 0.64], extra=[("other", "h1", 0.648)])
    auto = json.loads(run_cli("compare", "r1", "other", "--margin", "auto", "--bootstrap", "200", "--json",
                              "--db", str(db), check=True).stdout)
    src = auto["margin_source"]
    assert src["source"] == MEASURED and src["runs"] == ["r0", "r1", "r2"] and auto["margin"] == src["value"]
    # dA ~ +0.028 with a narrow interval: beyond the paper's 0.02, within the measured ~2 x 0.02
    row = next(r for r in auto["rows"] if r["name"] == "other")
    lo, hi = row["delta_A_interval"]
    assert 0.02 < lo and hi < src["value"]
    assert row["verdict"].startswith("tie on ceiling")
    default = json.loads(run_cli("compare", "r1", "other", "--bootstrap", "200", "--json", "--db", str(db),
                                 check=True).stdout)
    assert default["margin_source"]["source"] == PAPER
    assert next(r for r in default["rows"] if r["name"] == "other")["verdict"] == "higher ceiling"
    text = run_cli("compare", "r1", "other", "--bootstrap", "200", "--db", str(db), check=True).stdout
    assert "margin 0.02 (the paper's default: three 8B ScaleRL runs within +-0.015, rounded up" in text
    proc = run_cli("compare", "other", "r1", "--margin", "auto", "--bootstrap", "200", "--db", str(db))
    assert proc.returncode == 2 and "needs at least 3 completed runs of recipe h1" in proc.stderr


def test_the_report_names_the_margin_and_its_runs(tmp_path):
    db = tmp_path / "s.db"
    _seed_store(db, [0.60, 0.62, 0.64], name="abl--base--s", extra=[("abl--v--s0", "h1", 0.70)])
    out_dir = tmp_path / "rep"
    proc = run_cli("report", "abl", "--margin", "auto", "--bootstrap", "200", "--out", str(out_dir),
                   "--db", str(db), cwd=tmp_path, check=True)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("margin "))
    assert "(measured: 2 x the sd" in line and "(abl--base--s0, abl--base--s1, abl--base--s2)" in line
    summary = (out_dir / "summary.md").read_text()
    assert "- margin from measured: 2 x the sd" in summary


def test_ablation_margins_file_given_auto(tmp_path):
    db = tmp_path / "s.db"
    _seed_store(db, [0.60, 0.62, 0.64])
    opts = FitOptions(bootstrap=200)
    with Store.open(db, create=False) as store:
        assert for_ablation(store, None, 0.02, "", "h0", opts).source == PAPER
        f = for_ablation(store, None, 0.03, "margin = 0.03 in a.toml", "h0", opts)
        assert (f.source, f.value, f.where) == ("file", 0.03, "margin = 0.03 in a.toml")
        g = for_ablation(store, 0.05, 0.03, "margin = 0.03 in a.toml", "h0", opts)
        assert (g.source, g.value) == (GIVEN, 0.05)
        a = for_ablation(store, None, "auto", "margin = 'auto' in a.toml", "h0", opts)
        assert a.source == MEASURED and a.runs == ("r0", "r1", "r2")


def test_ablate_plan_plans_the_seeds_that_measure_the_margin(tmp_path):
    """At the ablation's 500 steps (5 x C_mid of the simulated base: the rule of enough data) the
    plan's seed runs are the base's runs at that budget, the content hash --margin auto measures."""
    db = tmp_path / "none.db"
    args = ["ablate", "--forward", "loss.type=gspo", "--setup", "simulated", "--budget-steps", "500", "--plan",
            "--db", str(db)]
    data = json.loads(run_cli(*args, "--json", check=True).stdout)["power"]
    seeds = data["margin_seeds"]
    assert (seeds["have"], seeds["more"], seeds["seeds"], seeds["budget_steps"]) == ([], 3, [0, 1, 2], 500)
    assert seeds["identifies"] and seeds["reach"] == pytest.approx(5.0)
    assert seeds["device_hours"] == pytest.approx(3 * 500 * 0.001)
    assert seeds["commands"][0].startswith("scalectl run ") and seeds["commands"][0].endswith(
        "--set budget.steps=500 --seed 0")
    assert data["margin_source"]["source"] == PAPER
    # the planned runs are what --margin auto measures: the base's content hash at this budget
    from scalectl.ablation.planner import forward_spec, plan

    base = plan(forward_spec([("loss.type", ("gspo",))]), setup=ROOT / "setups" / "simulated.toml",
                overrides=("budget.steps=500",)).variants[0]
    assert seeds["recipe_hash"] == base.recipe_hash
    text = run_cli(*args, check=True).stdout
    assert f"your own margin: 0 completed run(s) of the base recipe at 500 steps (hash {base.recipe_hash}); " \
           "3 more seed(s) measure it, about 1.5 device-hours, then --margin auto:" in text


def test_plan_proposes_margin_seeds_only_at_a_budget_that_identifies_the_ceiling(tmp_path):
    """The ablation's 100 steps reach 1 x C_mid: runs of that budget leave the ceiling unidentified
    and `scalectl margin` refuses them, so the plan says so up front and proposes the seeds at the
    budget of the rule (5 x C_mid = 500 steps), seed 0 extending the stored 100-step `scalerl-s0`
    (priced at the steps left).  Trained as proposed, the three runs measure a margin."""
    import functools
    import shlex

    from scalectl.ablation import until_decided
    from scalectl.ablation.planner import forward_spec
    from scalectl.launch import runs
    from scalectl.launch.runs import COMPLETED

    db, folder = tmp_path / "s.db", tmp_path / "runs"
    stores = functools.partial(Store.open, db)
    sets = ["model.path=simulated:seconds_per_step=0", "eval.every_steps=10"]
    assert runs.start(stores, "scalerl", setup="simulated", overrides=["budget.steps=100", *sets],
                      runs_dir=folder).name == "scalerl-s0"
    # --assume the true curve (C_mid 0.1 device-hours, 0.001 per step): the plan's numbers are exact
    staged = until_decided.prepare(forward_spec([("loss.type", ("ppo_clip",))]), db=str(db),
                                   setup=ROOT / "setups" / "simulated.toml", overrides=("budget.steps=100", *sets))
    p = until_decided.power(staged, {"C_mid": 0.1, "compute_per_step": 0.001, "s_fit": 0.005})
    m = p["margin_seeds"]
    assert (m["identifies"], m["ablation_budget_steps"], m["budget_steps"], m["reach"]) == (False, 100, 500,
                                                                                          pytest.approx(1.0))
    assert m["seeds"] == [0, 1, 2] and m["stored"] == {0: {"action": "extend", "run": "scalerl-s0", "steps": 100}}
    assert m["steps"] == 400 + 500 + 500 and m["device_hours"] == pytest.approx(1.4)
    assert all(c.endswith(f"--set budget.steps=500 --seed {s}") for s, c in zip(m["seeds"], m["commands"]))

    from rich.console import Console

    from scalectl.present.ablation import print_power

    shown = Console(record=True, width=400)
    print_power(shown, Console(file=io.StringIO()), p, "f")
    text = shown.export_text()
    assert ("your own margin: at 100 steps (the ablation's budget) the base reaches about 1.0 x C_mid, short of "
            "the 5 x C_mid where a ceiling counts as identified (docs/fitting.md): `scalectl margin` and "
            "--margin auto would leave runs of that budget out; at 500 steps: 0 completed run(s)") in text
    assert f"then `scalectl margin` (recipe {m['recipe_hash']}) and --margin VALUE" in text
    assert "--seed 0   # extends scalerl-s0 (100 steps trained)" in text

    for command in m["commands"]:                      # as the user would run them (in this process)
        words = shlex.split(command)
        recipe, setup = words[2], words[words.index("--setup") + 1]
        overrides = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        started = runs.start(stores, recipe, setup=setup, overrides=[*overrides, *sets,
                             f"seed={words[words.index('--seed') + 1]}"], runs_dir=folder)
        assert started.outcome == COMPLETED
    with Store.open(db, create=False) as store:
        assert sorted(r["name"] for r in store.list_runs()) == ["scalerl-s0", "scalerl-s1", "scalerl-s2"]
        measured = measure_hash(store, m["recipe_hash"], FitOptions(bootstrap=200))
    assert measured.source == MEASURED and measured.runs == ("scalerl-s0", "scalerl-s1", "scalerl-s2")
    assert not measured.left_out


def test_a_seed_trained_further_still_counts_for_the_margin_of_its_first_budget(tmp_path):
    """Three seeds at 100 steps (5 x C_mid of a simulated curve with C_mid 0.02) measure a margin;
    seed 0 is then extended to 150 steps (as --until-decided extends a base run it takes), so its
    hash is the longer budget's: --margin auto of the 100-step recipe still counts it, fitted on its
    points up to step 100, and measures the same margin; without the recipe only 2 runs remain."""
    import functools

    from scalectl.ablation import until_decided
    from scalectl.ablation.planner import forward_spec
    from scalectl.launch import runs
    from scalectl.recipe.load import load

    db, folder = tmp_path / "s.db", tmp_path / "runs"
    stores = functools.partial(Store.open, db)
    sets = ["model.path=simulated:C_mid=0.02,seconds_per_step=0", "eval.every_steps=10", "budget.steps=100"]
    for seed in (0, 1, 2):
        runs.start(stores, "scalerl", setup="simulated", overrides=[*sets, f"seed={seed}"], runs_dir=folder)
    recipe = load("scalerl", "simulated", sets)
    opts = FitOptions(bootstrap=200)
    with Store.open(db, create=False) as store:
        before = measure_hash(store, recipe.content_hash, opts)
    assert before.runs == ("scalerl-s0", "scalerl-s1", "scalerl-s2")
    assert runs.resume(stores, "scalerl-s0", overrides=["budget.steps=150"]).outcome == runs.COMPLETED
    with Store.open(db, create=False) as store:
        with pytest.raises(UserError, match="needs at least 3 completed runs of recipe .* holds 2"):
            measure_hash(store, recipe.content_hash, opts)
        after = measure_hash(store, recipe.content_hash, opts, recipe=recipe)
    assert sorted(after.runs) == sorted(before.runs) and after.value == pytest.approx(before.value, rel=1e-12)
    assert sorted(after.ceilings) == pytest.approx(sorted(before.ceilings), rel=1e-12)
    with Store.open(db, create=False) as store:     # the runs named (`scalectl margin RUN RUN RUN`): at 100 steps
        named = measure(store, [store.get_run(f"scalerl-s{s}") for s in (0, 1, 2)], opts)
    assert named.value == pytest.approx(before.value, rel=1e-12) and named.recipe_hash == recipe.content_hash
    staged = until_decided.prepare(forward_spec([("loss.type", ("ppo_clip",))]), db=str(db), setup="simulated",
                                   overrides=tuple(sets), margin="auto")
    assert staged.margin.source == MEASURED and staged.limits.margin == pytest.approx(before.value, rel=1e-12)
    p = until_decided.power(staged, {"C_mid": 0.02, "compute_per_step": 0.001, "s_fit": 0.005})
    assert p["margin_seeds"]["identifies"] and p["margin_seeds"]["more"] == 0
    assert p["margin_seeds"]["have"] == ["scalerl-s1", "scalerl-s2", "scalerl-s0"]


def test_until_decided_takes_a_measured_margin(tmp_path):
    from scalectl.ablation import until_decided as until
    from scalectl.ablation.planner import forward_spec, plan

    spec = forward_spec([("loss.type", ("gspo",))])
    setup = ROOT / "setups" / "simulated.toml"
    base_hash = plan(spec, setup=setup, overrides=("budget.steps=50",)).variants[0].recipe_hash
    db = tmp_path / "s.db"
    _seed_store(db, [0.60, 0.62, 0.64], recipe_hash=base_hash)
    staged = until.prepare(spec, db=str(db), setup=setup, overrides=("budget.steps=50",), margin="auto")
    assert staged.margin.source == MEASURED and staged.limits.margin == staged.margin.value
    assert staged.margin.recipe_hash == base_hash


def test_margin_until_step_reads_seeds_extended_past_their_budget_as_runs_of_it(tmp_path):
    """Three seeds at 100 steps measure a margin; all three extended to 150 steps then hold the
    150-step recipe's hash: `scalectl margin ... --until-step 100` fits each on its points up to
    step 100 and measures the margin of the 100-step runs again, under that recipe's hash; a step
    past a run's last one, runs of another recipe, or --until-step without runs are refused and
    the store is not changed."""
    import functools
    import hashlib

    from scalectl.launch import runs
    from scalectl.recipe.load import load

    db, folder = tmp_path / "s.db", tmp_path / "runs"
    stores = functools.partial(Store.open, db)
    sets = ["model.path=simulated:C_mid=0.02,seconds_per_step=0", "eval.every_steps=10", "budget.steps=100"]
    names = [f"scalerl-s{s}" for s in (0, 1, 2)]
    for seed in (0, 1, 2):
        runs.start(stores, "scalerl", setup="simulated", overrides=[*sets, f"seed={seed}"], runs_dir=folder)
    args = ["--db", str(db), "--bootstrap", "200", "--json"]
    before = json.loads(run_cli("margin", *names, *args, check=True).stdout)["margins"][0]
    for name in names:
        assert runs.resume(stores, name, overrides=["budget.steps=150"]).outcome == runs.COMPLETED
    longer = json.loads(run_cli("margin", *names, *args, check=True).stdout)["margins"][0]
    cut = json.loads(run_cli("margin", *names, "--until-step", "100", *args, check=True).stdout)["margins"][0]
    assert longer["recipe_hash"] == load("scalerl", "simulated", [*sets[:2], "budget.steps=150"]).content_hash
    assert cut["recipe_hash"] == before["recipe_hash"] == load("scalerl", "simulated", sets).content_hash
    assert cut["value"] == pytest.approx(before["value"], rel=1e-12)
    assert sorted(cut["ceilings"]) == pytest.approx(sorted(before["ceilings"]), rel=1e-12)
    assert longer["ceilings"] != pytest.approx(before["ceilings"], rel=1e-6)   # the 150 steps fit other points

    runs.start(stores, "grpo", setup="simulated", overrides=[*sets, "seed=0"], runs_dir=folder)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    refusals = [
        (["--until-step", "200"], "--until-step 200: run.s. not trained that far: scalerl-s0 .last step 150."),
        (["--until-step", "0"], "--until-step must be a step >= 1"),
        (["scalerl-s0", "scalerl-s1", "grpo-s0", "--until-step", "100"],
         "--until-step reads seeds of one recipe content .budgets aside.: scalerl-s0 .*grpo-s0"),
    ]
    for extra, message in refusals:
        argv = ["margin", *(names if extra[0].startswith("--") else []), *extra, "--db", str(db), "--bootstrap", "50"]
        proc = run_cli(*argv)
        assert proc.returncode == 2 and re.search(message, proc.stdout + proc.stderr), (argv, proc.stdout + proc.stderr)
    proc = run_cli("margin", "--until-step", "100", "--db", str(db))
    assert proc.returncode == 2 and "--until-step needs the runs named" in proc.stdout + proc.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
