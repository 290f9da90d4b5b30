"""Adaptive ablations: simulated curves, the decision rules, power planning, the
stages table, and the decision loop over many simulated variants in-process."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import replace

import numpy as np
import pytest

from scalectl.ablation.adaptive import SimBackend, fixed_design, initial_state, run_loop
from scalectl.science.compare import FASTER, HIGHER, LOWER, UNDECIDED, RunCurve, compare
from scalectl.curve import Flag, SigmoidFit
from scalectl.ablation.decisions import (
    CANNOT_WIN, EXTEND, HOLD, SEED, STOP, TIES, Arm, Limits, Need, decide, extended_budget, is_true_verdict, needed,
    pooled_seed_sd, widen_for_seeds,
)
from scalectl.errors import UserError
from scalectl.ablation.power import delta_half_width, plan_power, seeds_needed
from scalectl.curve.simulated import SimCurve, draw_points, eval_steps, parse_spec
from scalectl.store.database import SCHEMA_VERSION, Store

# ----------------------------------------------------------------------------- simulated curves


def test_parse_spec_defaults_and_errors():
    c = parse_spec("simulated:A=0.55,C_mid=2")
    assert (c.A, c.C_mid, c.B, c.R0) == (0.55, 2.0, SimCurve().B, SimCurve().R0)
    assert parse_spec(c.spec()) == c          # the written-out spec reads back
    for bad, words in (("simulated:A=x", "not a number"), ("simulated:Q=1", "KEY one of"),
                       ("simulated:A=1.5", "A = 1.5 must be in [0, 1]"),
                       ("simulated:corr_rho=1", "corr_rho = 1 must be in [0, 1)"), ("builtin:tiny", "does not start")):
        with pytest.raises(UserError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            parse_spec(bad)


def test_draw_points_extend_keeps_the_prefix_and_the_noise_has_its_size():
    c = SimCurve(A=0.6, B=2.0, C_mid=0.1, R0=0.3, hours_per_step=0.001, eval_sd=0.006, corr_sd=0.006,
                 corr_rho=0.6, seed_sd=0.0)
    short = draw_points(c, 3, eval_steps(200, 10))
    long = draw_points(c, 3, eval_steps(600, 10))
    assert long[:len(short)] == short
    assert [p["step"] for p in short] == list(range(0, 201, 10))
    assert short[5]["gpu_hours"] == pytest.approx(0.05)
    # residuals from the true curve over many seeds: sd sqrt(eval^2 + corr^2) = 0.00849 past step 0,
    # lag-one correlation corr_sd^2 rho / (eval^2 + corr^2) = 0.3.  4,000 seeds x 60 points: the sd
    # estimate's standard error is ~0.00849 / sqrt(2 * 4000) ~ 1e-4 (correlated points: allow 3e-4)
    steps = eval_steps(600, 10)
    truth = c.true_pass_rate(np.array(steps) * c.hours_per_step)
    res = np.array([[p["pass_rate"] for p in draw_points(c, s, steps)] for s in range(4000)]) - truth
    assert res[:, 1:].std() == pytest.approx(math.hypot(0.006, 0.006), abs=3e-4)
    assert res[:, 0].std() == pytest.approx(0.006, abs=3e-4)             # step 0: evaluation noise only
    lag1 = np.mean(res[:, 1:-1] * res[:, 2:]) / res[:, 1:].var()
    assert lag1 == pytest.approx(0.3, abs=0.03)
    # the seed offset of the ceiling: A_s - A has sd seed_sd over seeds
    s = replace(c, seed_sd=0.01, eval_sd=0.0, corr_sd=0.0)
    last = np.array([draw_points(s, k, [100000])[0]["pass_rate"] for k in range(2000)])
    assert last.std() == pytest.approx(0.01, rel=0.06)                 # se of an sd over 2000: 1.6 %


# ----------------------------------------------------------------------------- rules


def _fit(A, lo, hi, C_mid=0.1, last=0.5, flags=(), level=0.95):
    return SigmoidFit(A=A, B=2.0, C_mid=C_mid, R0=0.3, r0_fitted=False, window=(0.01, last), n_points=50,
                      rmse=0.008, method="vp", flags=tuple(flags), intervals={"A": (lo, hi)}, level=level)


def test_pooled_seed_sd_and_widening_by_hand():
    # arm a: 0.60, 0.62 (ss 2e-4, df 1); arm b: 0.50, 0.51, 0.52 (ss 2e-4, df 2); prior 0.0075 at 4 df
    sd, df = pooled_seed_sd({"a": [0.60, 0.62], "b": [0.50, 0.51, 0.52], "c": [0.7]}, 0.0075, 4)
    assert df == 3
    assert sd == pytest.approx(math.sqrt((4e-4 + 4 * 0.0075 ** 2) / 7))
    f = _fit(0.6, 0.597, 0.61)
    w = widen_for_seeds(f, 4, 0.01)                   # z 1.95996 * 0.01 / 2 = 0.0098
    assert w.interval("A") == pytest.approx((0.6 - 0.0097998, 0.61))
    assert w.A == f.A and f.interval("A") == (0.597, 0.61)


def _arms_and_comparison(base_fit, fits: dict, budgets=None, seeds=None, cps=0.001):
    x = np.linspace(0, 0.5, 51)
    arms = [Arm("base", (budgets or {}).get("base", 500), (seeds or {}).get("base", 1), base_fit, cps, True)]
    curves = {"base": RunCurve(x, base_fit.predict(x), base_fit)}
    for n, f in fits.items():
        arms.append(Arm(n, (budgets or {}).get(n, 500), (seeds or {}).get(n, 1), f, cps))
        curves[n] = RunCurve(x, f.predict(x), f)
    return arms, compare(curves, baseline="base")


def test_decide_each_rule():
    lim = Limits(max_budget=2000, max_seeds=3, step_multiple=10, min_reach=3.0)
    base = _fit(0.60, 0.595, 0.605)
    arms, cmp = _arms_and_comparison(base, {
        "up": _fit(0.66, 0.655, 0.665),                                    # dA +0.06, interval clear of +-0.01
        "down": _fit(0.50, 0.49, 0.51),
        "tie": _fit(0.601, 0.597, 0.605),                                  # inside (-0.02, 0.02)
        "noisy": _fit(0.615, 0.585, 0.645),                                # straddles, wider than the base
        "short": _fit(0.62, 0.5, 0.9, C_mid=0.3, last=0.5,
                      flags=[Flag("ceiling_not_identified", "x")]),       # extend to 3 x 0.3 / 0.001
        "near": _fit(0.575, 0.570, 0.5955),                                # "lower" but hi within -0.005
    })
    d = decide(arms, cmp, lim)
    assert (d["up"].action, d["up"].verdict) == (STOP, HIGHER)
    assert (d["down"].action, d["down"].verdict) == (STOP, LOWER)
    assert d["tie"].action == STOP and d["tie"].verdict in TIES
    assert (d["noisy"].action, d["noisy"].seeds) == (SEED, 2)
    # 3 C_mid / cps = 900 steps, within [1.5 x 500, 4 x 500], a multiple of 10
    assert (d["short"].action, d["short"].budget) == (EXTEND, 900)
    assert (d["near"].action, d["near"].verdict) == (SEED, UNDECIDED)   # dA -0.025 [-0.032, -0.004]: not beyond 0.005
    assert d["base"].action == HOLD                                     # nothing asks the base for more


def test_a_difference_stops_only_when_its_whole_interval_lies_beyond_the_margin():
    """dA +0.026 [+0.011, +0.041] (a simulated campaign's variant at a true +0.018 ended near
    this): compare calls it higher (estimate beyond the margin, interval beyond half of it),
    but the interval reaches inside the margin, where a true tie lies, so the loop does not
    stop it (with the quarter-margin claim it did: "higher ceiling" for a tie).  Beyond the
    margin on its whole interval it stops, as a tie stops only inside it."""
    lim = Limits(max_budget=2000, max_seeds=3, step_multiple=10, min_reach=3.0)
    base = _fit(0.600, 0.5925, 0.6075)
    arms, cmp = _arms_and_comparison(base, {"edge": _fit(0.626, 0.6165, 0.6355),
                                            "clear": _fit(0.640, 0.6335, 0.6465)})
    assert cmp.row("edge").verdict == HIGHER and cmp.row("clear").verdict == HIGHER
    lo, hi = cmp.row("edge").delta_A_interval                      # 0.026 -+ hypot(0.0095, 0.0075)
    assert (lo, hi) == pytest.approx((0.026 - math.hypot(0.0095, 0.0075), 0.026 + math.hypot(0.0095, 0.0075)))
    assert 0.01 < lo < 0.02
    d = decide(arms, cmp, lim)
    assert (d["edge"].action, d["edge"].verdict) == (SEED, UNDECIDED)
    assert f"reaches within +-{lim.margin:.3f}" in d["edge"].reason
    assert (d["clear"].action, d["clear"].verdict) == (STOP, HIGHER)   # dA 0.040 [0.030, 0.050]
    old = decide(arms, cmp, replace(lim, claim=0.25))
    assert (old["edge"].action, old["edge"].verdict) == (STOP, HIGHER)


def test_decide_base_seed_caps_and_cannot_win():
    lim = Limits(max_budget=500, max_seeds=2, min_reach=3.0)
    base = _fit(0.60, 0.58, 0.62)
    arms, cmp = _arms_and_comparison(base, {"n": _fit(0.612, 0.606, 0.618)})
    d = decide(arms, cmp, lim)
    assert (d["n"].action, d["base"].action, d["base"].seeds) == (HOLD, SEED, 2)  # the base is the wider
    # at max seeds and max budget: nothing left, stop undecided
    arms, cmp = _arms_and_comparison(base, {"n": _fit(0.612, 0.595, 0.63)}, seeds={"base": 2, "n": 2})
    d = decide(arms, cmp, lim)
    assert (d["n"].action, d["n"].verdict) == (STOP, UNDECIDED) and "nothing left to try" in d["n"].reason
    assert d["base"].action == STOP
    # cannot win: against another variant only with race; verdict "cannot win"
    arms, cmp = _arms_and_comparison(base, {"best": _fit(0.70, 0.69, 0.71), "mid": _fit(0.61, 0.60, 0.62)})
    assert decide(arms, cmp, replace(lim, race=True))["mid"].verdict == CANNOT_WIN
    assert decide(arms, cmp, lim)["mid"].action != STOP


def test_a_run_that_declines_after_a_peak_is_not_extended():
    """A pass rate that falls after a peak (late_decline: the sigmoid does not describe
    the run) is not a ceiling that a longer run identifies: the variant stops undecided,
    whether its own run or the base's declines, and nothing is asked of a budget."""
    lim = Limits(max_budget=2400, max_seeds=2, step_multiple=20)
    decline = Flag("late_decline", "pass rate falls after a peak")
    short = [Flag("ceiling_not_identified", "x")]
    base = _fit(0.60, 0.5, 1.0, C_mid=0.3, last=0.4, flags=short)
    arms, cmp = _arms_and_comparison(base, {
        "falls": _fit(0.64, 0.58, 1.0, C_mid=0.3, last=0.4, flags=[*short, decline]),
        "rises": _fit(0.64, 0.58, 1.0, C_mid=0.3, last=0.4, flags=short),
    })
    d = decide(arms, cmp, lim)
    assert (d["falls"].action, d["falls"].verdict) == (STOP, UNDECIDED)
    assert "falls declines after a peak" in d["falls"].reason
    assert (d["rises"].action, d["base"].action) == (EXTEND, EXTEND)     # the base is still extended for "rises"
    assert needed(arms[1], arms[0], None, lim) == Need({}, None, declining=("falls",))
    # the base declines: no variant can be judged against it, nothing is extended
    arms, cmp = _arms_and_comparison(replace(base, flags=(*base.flags, decline)), {
        "rises": _fit(0.64, 0.58, 1.0, C_mid=0.3, last=0.4, flags=short)})
    d = decide(arms, cmp, lim)
    assert (d["rises"].action, d["rises"].verdict, d["base"].action) == (STOP, UNDECIDED, STOP)
    assert "base declines after a peak" in d["rises"].reason


def test_extended_budget_bounds():
    lim = Limits(max_budget=1000, step_multiple=20, min_reach=3.0)
    f = _fit(0.6, 0.5, 0.7, C_mid=10.0)                      # advice far away: capped at 4 x budget
    assert extended_budget(Arm("a", 100, 1, f, 0.001), lim) == 400
    f = _fit(0.6, 0.5, 0.7, C_mid=0.001)                     # advice below: at least 1.5 x, rounded to 20
    assert extended_budget(Arm("a", 100, 1, f, 0.001), lim) == 160
    assert extended_budget(Arm("a", 900, 1, f, 0.001), lim) == 1000


def test_what_an_undecided_variant_needs_by_hand():
    lim = Limits(max_budget=400, max_seeds=2, step_multiple=20)
    # ceilings not identified: 5 x C_mid in steps, compute per step = last compute / budget
    short = _fit(0.62, 0.5, 1.0, C_mid=0.3, last=0.4, flags=[Flag("ceiling_not_identified", "x")])
    base = _fit(0.60, 0.59, 0.61, C_mid=0.05, last=0.4)             # identified: 0.4 >= 5 x 0.05
    need = needed(Arm("v", 400, 1, short, 0.4 / 400), Arm("base", 400, 1, base, 0.4 / 400), (-0.1, 0.4), lim)
    assert need == Need(budgets={"v": 1500}, seeds=None)             # 5 x 0.3 / 0.001 = 1500, a multiple of 20
    far = _fit(0.60, 0.5, 1.0, C_mid=0.11, last=0.4, flags=[Flag("ceiling_not_identified", "x")])
    need = needed(Arm("v", 400, 1, short, 0.001), Arm("base", 400, 1, far, 0.001), None, lim)
    assert need.budgets == {"v": 1500, "base": 560}                  # 5 x 0.11 / 0.001 = 550 -> 560
    # both identified, at --max-seeds 2 each: dA [-0.01, +0.03], half-width 0.02 = k sqrt(1/2 + 1/2);
    # n per arm with k sqrt(2 / n) <= margin / 2 = 0.01: n >= 2 x 0.02^2 / 0.01^2 = 8
    ok = _fit(0.61, 0.60, 0.62, C_mid=0.05, last=0.4)
    need = needed(Arm("v", 400, 2, ok, 0.001), Arm("base", 400, 2, base, 0.001), (-0.01, 0.03), lim)
    assert need == Need(budgets={}, seeds=8)
    # with 1 and 3 seeds: k = 0.02 / sqrt(1 + 1/3) = 0.01732; n >= 2 x 0.01732^2 / 0.01^2 = 6
    need = needed(Arm("v", 400, 1, ok, 0.001), Arm("base", 400, 3, base, 0.001), (-0.01, 0.03), lim)
    assert need.seeds == 6
    assert needed(Arm("v", 400, 1, None), Arm("base", 400, 1, base, 0.001), None, lim) == Need({"v": None}, None)


def test_true_verdicts():
    assert is_true_verdict(HIGHER, 0.03, 0.02) and not is_true_verdict(HIGHER, 0.01, 0.02)
    assert is_true_verdict(FASTER, -0.01, 0.02) and is_true_verdict(UNDECIDED, 0.0, 0.02) is None


# ----------------------------------------------------------------------------- power


def test_power_by_hand():
    # n = ceil(2 * 1.95996^2 * (0.004^2 + 0.0075^2) / 0.01^2) = ceil(5.5513) = 6
    assert seeds_needed(0.004, 0.0075, 0.02) == 6
    p = plan_power(C_mid=0.1, compute_per_step=0.001, s_fit=0.004, s_seed=0.0075, arms=8, margin=0.02,
                   hours_per_step=0.001, step_multiple=20)
    assert (p.budget_steps, p.seeds) == (500, 6)                    # 5 x C_mid / compute per step
    assert p.device_hours == pytest.approx(8 * 6 * 500 * 0.001)
    assert p.half_width == pytest.approx(delta_half_width(0.004, 0.0075, 6)) and p.half_width <= 0.01
    capped = plan_power(C_mid=0.1, compute_per_step=0.001, s_fit=0.004, s_seed=0.0075, arms=8,
                        max_budget=200, max_seeds=3)
    assert (capped.budget_steps, capped.seeds, capped.capped, capped.device_hours) == (200, 3, True, None)


# ----------------------------------------------------------------------------- store


def test_stages_table_migration_and_round_trip(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)                                     # a store at schema version 1
    from scalectl.store.database import _migrate_1
    import sqlite_utils

    _migrate_1(sqlite_utils.Database(conn))
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO runs (name, status) VALUES ('kept', 'completed')")
    conn.commit()
    conn.close()
    with Store.open(path) as s:
        assert s.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        assert s.get_run("kept")["status"] == "completed"            # nothing stored is lost
        s.add_stage("abl", 0, [{"variant": "base", "is_base": True, "budget": 100, "seeds": 1, "action": "extend",
                                "verdict": "baseline", "reason": "", "next_budget": 300, "next_seeds": 1,
                                "flags": ["ceiling_not_identified"], "fit": {"A": 0.5}}], 0.25)
        s.add_stage("abl", 1, [{"variant": "base", "is_base": True, "budget": 300, "seeds": 1, "action": "stop",
                                "verdict": "baseline", "reason": "", "next_budget": 300, "next_seeds": 1}], 0.5)
        rows = s.stages("abl")
        assert [(r["stage"], r["budget"], r["next_budget"], r["spent_hours"]) for r in rows] == \
            [(0, 100, 300, 0.25), (1, 300, 300, 0.5)]
        assert rows[0]["flags"] == ["ceiling_not_identified"] and rows[0]["fit"] == {"A": 0.5}
        assert rows[0]["is_base"] is True and s.stages("other") == []
        with pytest.raises(ValueError, match="unknown stage keys"):
            s.add_stage("abl", 2, [{"variant": "x", "colour": "red"}], 0.0)


# ----------------------------------------------------------------------------- the loop, in-process


@pytest.mark.slow
def test_loop_on_two_hundred_simulated_variants():
    """200 variants, ceilings -0.08..+0.08 from the base's but none within 0.01 of the
    margin's edge (+-0.02), where no finite budget decides: no wrong higher/lower,
    >= 90 % true verdicts."""
    rng = np.random.default_rng(7)
    base = SimCurve(A=0.60, B=2.0, C_mid=0.1, R0=0.30, hours_per_step=0.001)
    deltas = rng.uniform(-0.08, 0.08, 400)
    deltas = deltas[np.abs(np.abs(deltas) - 0.02) >= 0.01][:200]
    curves = {"base": base, **{f"v{i:03d}": replace(base, A=round(0.60 + d, 4)) for i, d in enumerate(deltas)}}
    truth = {f"v{i:03d}": d for i, d in enumerate(deltas)}
    res = run_loop(SimBackend(curves, every=10), initial_state(list(curves), "base", 100),
                   Limits(max_budget=800, max_seeds=4, step_multiple=10), fit_kw={"bootstrap": 100, "level": 0.99})
    marks = [is_true_verdict(res.decisions[n].verdict, d, 0.02) for n, d in truth.items()]
    assert marks.count(False) == 0
    assert marks.count(True) >= 0.9 * len(truth)
    assert res.stages and res.stages[0].stage == 0 and len(res.stages[0].rows) == 201


def test_loop_resumes_from_a_state_and_respects_the_total_budget():
    base = SimCurve(A=0.60, B=2.0, C_mid=0.1, R0=0.30, hours_per_step=0.001)
    curves = {"base": base, "up": replace(base, A=0.68), "down": replace(base, A=0.52)}
    be = SimBackend(curves, every=10)
    lim = Limits(max_budget=800, max_seeds=3, step_multiple=10)
    full = run_loop(be, initial_state(list(curves), "base", 100), lim, fit_kw={"bootstrap": 100})
    assert full.ended == "decided"
    assert {n: d.verdict for n, d in full.decisions.items()} == {"base": "baseline", "up": HIGHER, "down": LOWER}
    # stage 0 costs 3 arms x 100 steps x 0.001 = 0.3 device-hours: a total budget of 0.35 stops after it
    short = run_loop(be, initial_state(list(curves), "base", 100), lim, fit_kw={"bootstrap": 100},
                     total_budget=0.35)
    assert short.ended == "total budget" and len(short.stages) == 1
    assert short.spent_hours == pytest.approx(0.3)
    # continuing from where it stopped reaches the same verdicts as the uninterrupted loop
    more = run_loop(be, short.state, lim, fit_kw={"bootstrap": 100})
    assert more.stages[0].stage == 1
    assert {n: d.verdict for n, d in more.decisions.items()} == {n: d.verdict for n, d in full.decisions.items()}
    assert more.spent_hours == pytest.approx(full.spent_hours)


def test_the_loop_counts_what_a_backend_measured_not_its_estimate():
    """A real run's device-hours per step drift (load, completion lengths): the estimate
    that gates a stage is not what it spent.  Here the estimate is twice the rate
    the runs measure; the loop's spend and its --total-budget check use the measure."""

    class Measured(SimBackend):
        def hours_per_step(self, name):
            return 2 * super().hours_per_step(name)          # 0.002: the estimate

        def spent_hours(self):                               # 0.001 per step trained, as measured
            return 0.001 * sum(sum(a.trained.values()) for a in self.state.arms.values())

    base = SimCurve(A=0.60, B=2.0, C_mid=0.1, R0=0.30, hours_per_step=0.001)
    be = Measured({"base": base, "v": replace(base, A=0.605)}, every=10)
    lim = Limits(max_budget=400, max_seeds=1, step_multiple=10)
    be.state = initial_state(["base", "v"], "base", 100)
    first = run_loop(be, be.state, lim, fit_kw={"bootstrap": 50}, max_stages=1)
    assert first.spent_hours == pytest.approx(0.2)                 # 200 steps measured at 0.001, not 0.4
    need = sum(a.budget - a.trained[0] for a in first.state.arms.values())   # stage 1's steps to go
    assert need > 0
    # stage 1 is gated on spent + estimate: 0.2 + 0.002 need measured, 0.4 + 0.002 need estimated;
    # a --total-budget between the two lets it run, and what it spent is measured again
    be.state = initial_state(["base", "v"], "base", 100)
    res = run_loop(be, be.state, lim, fit_kw={"bootstrap": 50}, max_stages=2, total_budget=0.3 + 0.002 * need)
    assert len(res.stages) == 2 and res.spent_hours == pytest.approx(0.2 + 0.001 * need)


def test_the_total_budget_stop_says_what_the_next_stage_costs():
    from scalectl.ablation.adaptive import ArmState, LoopState
    from scalectl.ablation.staged import total_budget_line

    be = SimBackend({"base": SimCurve(hours_per_step=0.001), "v": SimCurve(hours_per_step=0.001)})
    state = LoopState(2, {"base": ArmState("base", 400, 1, is_base=True, trained={0: 100}),
                          "v": ArmState("v", 400, 2, trained={0: 100}),
                          "done": ArmState("done", 100, 1, stopped=HIGHER, trained={0: 100})}, spent_hours=0.3)
    # base 300 steps to go, v 300 + 400 (a new seed): 1,000 steps x 0.001 device-hours
    assert total_budget_line(state, be, 0.35) == (
        "stopped: the next stage (base 400 steps x1, v 400 steps x2) would cost about 1 device-hours, "
        "past --total-budget 0.35 (0.3 spent)")


def test_a_loop_resumed_after_it_ran_out_of_options_still_says_so(tmp_path):
    """A variant stopped "undecided" at its limits stays so when the loop is started
    again from the stages table (the same command run again): no stage is added and
    the loop ends "out of options", not "decided"."""
    from scalectl.ablation.staged import reopen_undecided, state_from_stages

    base = SimCurve(A=0.60, B=2.0, C_mid=0.1, R0=0.30, hours_per_step=0.001)
    be = SimBackend({"base": base, "v": replace(base, A=0.61)}, every=10)
    # 100 steps reach 1 x C_mid (the rule wants 5 x) and --max-budget is 100: nothing left to try
    lim = Limits(max_budget=100, max_seeds=1, step_multiple=10)
    with Store.open(tmp_path / "s.db") as store:
        first = run_loop(be, initial_state(["base", "v"], "base", 100), lim, fit_kw={"bootstrap": 50},
                         record=lambda st: store.add_stage("abl", st.stage, st.rows, st.spent_hours))
        rows = store.stages("abl")
    assert first.ended == "out of options" and first.decisions["v"].verdict == UNDECIDED
    assert [(r["stage"], r["variant"], r["action"]) for r in rows] == [(0, "base", STOP), (0, "v", STOP)]
    state = state_from_stages(rows, "base", ["base", "v"], 100)
    assert state.stage == 1 and state.arms["v"].stopped == UNDECIDED
    again = run_loop(be, state, lim, fit_kw={"bootstrap": 50})
    assert again.stages == () and again.ended == "out of options"
    # decided again from the stored fits: the same limits stop it again, a larger budget reopens it
    assert reopen_undecided(rows, state, lim) == [] and state.arms["v"].stopped == UNDECIDED
    assert reopen_undecided(rows, state, replace(lim, max_seeds=3)) == []     # seeds do not identify a ceiling
    assert reopen_undecided(rows, state, replace(lim, max_budget=800)) == ["v"]
    assert state.arms["v"].stopped is None and (state.arms["v"].budget, state.arms["v"].seeds) == (100, 1)
    more = run_loop(be, state, replace(lim, max_budget=800), fit_kw={"bootstrap": 50}, max_stages=1)
    assert more.stages[0].stage == 1 and more.decisions["v"].action == EXTEND


@pytest.mark.slow
def test_twenty_variants_adaptive_against_fixed():
    """The acceptance check (scripts/adaptive_vs_fixed.py prints the whole grid)."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("avf", ROOT / "scripts/adaptive_vs_fixed.py")
    avf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(avf)
    arms = avf.arms()
    curves = {n: c for n, (c, _) in arms.items()}
    truth = {n: d for n, (_, d) in arms.items() if n != "base"}
    be = SimBackend(curves, every=10, seed0=0)
    fit_kw = {"bootstrap": 400, "level": 0.99}
    limits = Limits(max_budget=1600, max_seeds=6, step_multiple=10)
    res = run_loop(be, initial_state(list(curves), "base", 100), limits, fit_kw=fit_kw)
    good, wrong = avf.score({n: d.verdict for n, d in res.decisions.items() if n != "base"}, truth, 0.02)
    assert wrong == 0 and good >= 18
    # every fixed design costing less than twice the adaptive spend is less accurate (or wrong)
    for budget, seeds in ((600, 1), (600, 2), (800, 1), (800, 2), (1200, 1), (1600, 1)):
        if 21 * budget * seeds * 0.001 >= 2 * res.spent_hours:
            continue
        v, _ = fixed_design(be, list(curves), "base", budget, seeds, limits, fit_kw=fit_kw)
        g, w = avf.score(v, truth, 0.02)
        assert g < good or w > 0, (budget, seeds, g, w)


@pytest.mark.slow
def test_a_campaign_with_variants_near_both_edges_of_the_margin_gets_no_wrong_verdict():
    """scripts/adaptive_campaigns.py's "slow-rise" campaign (16 variants, 7 of them within
    0.006 of an edge of the margin), one noise seed, 400 resamples: no wrong verdict (the
    target is at most 1 in 20), and the far ones (|dA| >= 0.05) and the exact tie decided."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("camp", ROOT / "scripts/adaptive_campaigns.py")
    camp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(camp)
    base, offsets, initial = camp.CAMPAIGNS["report"]["slow-rise"]
    rows, hours, _ = camp.run_campaign(base, offsets, initial, 3, 400)
    assert [r for r in rows if r[3] is False] == []
    decided = {d: ok for _, d, _, ok in rows}
    assert decided[-0.06] and decided[0.05] and decided[0.0]
    assert hours > 0
