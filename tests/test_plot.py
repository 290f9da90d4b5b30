"""Figures are written as valid PNG and SVG files (scalectl.present.plot)."""

import math
import xml.etree.ElementTree as ET

import matplotlib.image
import numpy as np
import pytest

from scalectl.science.compare import RunCurve, loo_lines
from scalectl.curve import fit_sigmoid, sigmoid
from scalectl.science.extrapolate import extrapolate
from scalectl.display import format_estimate
from scalectl.present import style
from scalectl.present.plot import (
    curves_figure,
    extrapolation_figure,
    loo_figure,
    plot_curves,
    plot_extrapolation,
    plot_loo,
    truncation_figure,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(A, B, c_mid, seed, reach=5.0, collapse=False):
    x = np.linspace(0.0, reach * c_mid, 41)
    y = sigmoid(x, A, B, c_mid, 0.3) + np.random.default_rng(seed).normal(0, 0.005, x.size)
    if collapse:
        y = np.where(x > 0.7 * x.max(), y - 0.4 * (x / x.max() - 0.7), y)
    return RunCurve(x, y, fit_sigmoid(x, y, min_compute=1500, seed=seed, bootstrap=200))


@pytest.fixture(scope="module")
def runs():
    return {"scalerl": run(0.61, 1.92, 2542, 1), "minimax": run(0.61, 1.77, 2818, 2),
            "unstable": run(0.55, 1.6, 3000, 3, collapse=True)}


def check_png(path, size=(750, 500)):
    assert path.read_bytes()[:8] == PNG_MAGIC
    img = matplotlib.image.imread(path)
    assert img.shape[:2] == (size[1], size[0])
    assert img[..., :3].std() > 0.05                      # not a blank canvas


def check_svg(path, *texts):
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    body = path.read_text()
    for t in texts:
        assert t in body


def test_curves_png_and_svg(runs, tmp_path):
    png = plot_curves(runs, tmp_path / "curves.png", baseline="scalerl")
    check_png(png)
    svg = plot_curves(runs, tmp_path / "sub" / "curves.svg", baseline="scalerl")
    check_svg(svg, "training compute (GPU-hours)", "pass rate (mean@k)", "scalerl: A 0.61",
              "late_decline", "scalerl ceiling +-0.02")


def test_extrapolation_png_and_svg(tmp_path):
    x = np.linspace(0, 100_000, 81)
    y = sigmoid(x, 0.645, 1.70, 10909, 0.3) + np.random.default_rng(0).normal(0, 0.005, x.size)
    ex = extrapolate(x, y, fraction=0.5, min_compute=1500, bootstrap=300)
    keep = x <= ex.cut
    check_png(plot_extrapolation(ex, tmp_path / "ex.png", name="8B batch 2048",
                                 fitted_compute=x[keep], fitted_pass_rate=y[keep]))
    check_svg(plot_extrapolation(ex, tmp_path / "ex.svg", name="8B batch 2048"),
              "held-out points", "95% prediction band", "inside band")


def test_loo_png_and_svg(runs, tmp_path):
    lines = loo_lines({k: v for k, v in runs.items() if k != "unstable"})
    check_png(plot_loo(lines, tmp_path / "loo.png"))
    check_svg(plot_loo(lines, tmp_path / "loo.svg"), "slope = B", "scalerl: B")


def test_mixed_hardware_is_named_in_the_title(runs, tmp_path):
    mixed = dict(runs)
    mixed["gb200"] = RunCurve(runs["scalerl"].compute, runs["scalerl"].pass_rate,
                              runs["scalerl"].fit, hardware="GB200")
    mixed["scalerl"] = RunCurve(runs["scalerl"].compute, runs["scalerl"].pass_rate,
                                runs["scalerl"].fit, hardware="H100")
    check_svg(plot_curves(mixed, tmp_path / "mixed.svg"), "mixed hardware: GB200, H100")


def test_unsupported_extension_and_bad_baseline(runs, tmp_path):
    with pytest.raises(ValueError, match=r"extension '.jpg' is not one of .png, .svg"):
        plot_curves(runs, tmp_path / "c.jpg")
    with pytest.raises(ValueError, match="baseline 'nope' is not one of the plotted runs"):
        plot_curves(runs, tmp_path / "c.png", baseline="nope")


def test_fit_plot_draws_points_curve_ceiling_interval_and_margin(tmp_path, db_path):
    """`scalectl fit RUN --plot` through the console script on a real store."""
    import json

    from conftest import run_cli
    from scalectl.store.database import Store

    cur = run(0.61, 1.92, 2542, 1)
    with Store.open(db_path) as store:
        rid = store.create_run("scalerl-s0", hardware="H100")
        store.add_points(rid, [{"step": 10 * i, "gpu_hours": float(c), "pass_rate": float(p)}
                               for i, (c, p) in enumerate(zip(cur.compute, cur.pass_rate))])
    svg = tmp_path / "fit.svg"
    data = json.loads(run_cli("fit", "scalerl-s0", "--plot", str(svg), "--json", db=db_path,
                              check=True).stdout)
    assert data["plot"] == str(svg)
    a_lo, a_hi = data["fits"][0]["fit"]["intervals"]["A"]
    check_svg(svg, "scalerl-s0: A 0.61", "bars at the right: 95% interval of A", "scalerl-s0 ceiling +-0.02")
    body = svg.read_text()
    assert body.count("<use") > 40           # the points (markers drawn by <use>) and the ticks
    png = tmp_path / "fit.png"
    run_cli("fit", "scalerl-s0", "--plot", str(png), db=db_path, check=True)
    check_png(png)
    assert a_lo < 0.61 < a_hi


def test_run_summary_gives_the_fit_advice_and_plot(tmp_path, db_path):
    from scalectl.present.summary import summarize_run
    from scalectl.store.database import Store

    cur = run(0.61, 1.92, 2542, 4)
    with Store.open(db_path) as store:
        rid = store.create_run("tiny-s0")
        store.add_points(rid, [{"step": 10 * i, "gpu_hours": float(c), "pass_rate": float(p)}
                               for i, (c, p) in enumerate(zip(cur.compute, cur.pass_rate))])
        lines, data = summarize_run(store, rid, tmp_path / "curve.png")
        short = store.create_run("short-s0")
        store.add_points(short, [{"step": 0, "gpu_hours": 0.0, "pass_rate": 0.3},
                                 {"step": 10, "gpu_hours": 1.0, "pass_rate": 0.31}])
        none_lines, none_data = summarize_run(store, short, tmp_path / "none.png")
    assert lines[0].startswith("fit tiny-s0 (36 points on gpu_hours): A 0.6") and "flags: -" in lines[0]
    assert lines[-1] == f"plot: {tmp_path / 'curve.png'}"
    assert any(ln.startswith("advice: A interval width") for ln in lines)
    assert not any(ln.startswith("extend it:") for ln in lines)       # past 5 x C_mid: nothing to extend
    check_png(tmp_path / "curve.png")
    assert abs(data["fit"]["A"] - 0.61) < 0.01
    assert none_lines[0].startswith("fit: not yet possible:") and "error" in none_data
    assert not (tmp_path / "none.png").exists()


def test_a_log_compute_axis_labels_do_not_run_into_each_other():
    """1.4 decades of compute (2.7e11 .. 7e12, as a 400-step tiny run): matplotlib alone
    labelled 2e11, 3e11, 4e11, 6e11, ..., which ran into each other; the axis labels the
    1, 2 and 5 multiples there, and over 2.5 decades or more the powers of 10 alone, as
    plain numbers in the run's units (never 10^k in log units)."""
    def labelled(lo, hi):
        fig = style.new_figure()
        ax = style.new_axes(fig)
        ax.plot([lo, hi], [0.3, 0.6])
        style.compute_axis(ax, "flops", lo, hi)
        fig.canvas.draw()
        ticks = ax.xaxis.get_ticklabels() + ax.xaxis.get_ticklabels(minor=True)
        return [t.get_text() for t in sorted(ticks, key=lambda t: t.get_position()[0])
                if t.get_text() and lo <= t.get_position()[0] <= hi]

    assert labelled(2.7e11, 7e12) == ["5e11", "1e12", "2e12", "5e12"]
    assert labelled(1e10, 1e13) == ["1e10", "1e11", "1e12", "1e13"]
    assert labelled(0.004, 0.5) == ["0.005", "0.01", "0.02", "0.05", "0.1", "0.2", "0.5"]
    assert labelled(800, 40_000) == ["1,000", "2,000", "5,000", "10,000", "20,000"]


def test_the_margin_band_stops_at_one(runs):
    """The +-margin band around a ceiling at 1 is drawn from 1 - margin to 1, not above 1."""
    at_one = run(1.0, 1.5, 2542, 5)
    assert at_one.fit.A == pytest.approx(1.0, abs=0.02)
    fig = curves_figure({"top": at_one, **runs}, baseline="top", margin=0.02)
    fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.get_legend() is None and len(fig.legends) == 1
    renderer = fig.canvas.get_renderer()
    legend, axes = fig.legends[0].get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.y1 <= axes.y0                              # below the axes (display y grows upwards)
    band = next(p for p in ax.patches if p.get_label() == "top ceiling +-0.02")
    y_data = ax.transData.inverted().transform(band.get_window_extent(renderer).get_points())[:, 1]
    assert y_data.max() == pytest.approx(min(1.0, ax.get_ylim()[1]), abs=1e-9)
    assert y_data.min() == pytest.approx(min(at_one.fit.A, 1.0) - 0.02, abs=1e-9)


# --------------------------------------------------------------------------- what a reader sees


def _short(A, B, c_mid, seed, reach=0.9):
    """A run stopped before its midpoint: the ceiling is not identified and its interval runs to 1."""
    x = np.concatenate([[0.0], np.linspace(0.1, reach, 12) * c_mid])
    y = sigmoid(x, A, B, c_mid, 0.3) + np.random.default_rng(seed).normal(0, 0.005, x.size)
    return RunCurve(x, y, fit_sigmoid(x, y, min_compute=0.0, seed=seed, bootstrap=200))


def _points_of(ax):
    """(x, y) of every scatter point drawn on ``ax`` in data units."""
    offsets = [c.get_offsets() for c in ax.collections if len(c.get_offsets())]
    return np.concatenate(offsets) if offsets else np.empty((0, 2))


def _readable(fig, unit: str) -> None:
    """Every text inside the canvas; a log compute axis in ``unit``, its ticks plain numbers."""
    assert style.text_outside(fig) == []
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert unit in ax.get_xlabel() and not ax.get_xlabel().lower().startswith("log")
    lo, hi = ax.get_xlim()
    ticks = [t.get_text() for t in ax.xaxis.get_ticklabels() if t.get_text() and lo <= t.get_position()[0] <= hi]
    assert len(ticks) >= 2
    for text in ticks:                           # 0.02, 1,500, 2e12: numbers, not 10^k or mathtext
        float(text.replace(",", ""))


def test_long_legends_stay_inside_the_figure(runs):
    """Eight runs with long names and flags: the legend of the old figure (two columns, fixed)
    ran off both edges; now every label lies inside the canvas, wrapped if need be."""
    many = {f"a-rather-long-variant-name-number-{i}--s0": runs["unstable" if i % 3 == 0 else "scalerl"]
            for i in range(8)}
    fig = curves_figure(many, baseline=next(iter(many)))
    _readable(fig, "GPU-hours")
    assert len(fig.legends) == 1


def test_y_limits_come_from_the_data_not_from_an_interval_to_one(runs):
    """A short run's A interval reaches the bound 1.0; the axis holds the points, the curves and
    the identified ceilings, so the data fill the height, and the interval runs off the top
    of the ceilings' strip with an arrow."""
    short = _short(0.61, 1.9, 2542, 7)
    assert short.fit.has_flag("ceiling_not_identified") and short.fit.interval("A")[1] > 0.75
    fig = curves_figure({"short": short, "scalerl": runs["scalerl"]}, baseline="scalerl")
    _readable(fig, "GPU-hours")
    ax, strip = fig.axes
    y0, y1 = ax.get_ylim()
    data = np.concatenate([short.pass_rate, runs["scalerl"].pass_rate, [runs["scalerl"].fit.A + 0.02]])
    span = data.max() - data.min()
    assert y1 <= data.max() + 0.06 * span + 0.05        # the curve past the last point adds a little
    assert y1 < short.fit.interval("A")[1] - 0.1
    assert y0 >= min(data.min() - 0.06 * span, 0.25)
    arrows = [ln for ln in strip.lines if ln.get_marker() == "^"]
    assert arrows and all(ln.get_ydata()[0] == pytest.approx(y1) for ln in arrows)
    # its estimate (0.55) is inside the axes, only the interval runs on: nothing written above them
    assert short.fit.A < y1 and not [t for t in ax.texts if "lies above the axes" in t.get_text()]


def test_an_identified_ceilings_interval_is_inside_the_axes():
    """A run to 3 x C_mid, its ceiling identified: the y limits hold its whole interval (the bar
    in the strip is drawn whole, no arrow), not only the estimate; nothing is written above."""
    x = np.concatenate([[0.0], np.linspace(0.1, 3.0, 16) * 2542])
    y = sigmoid(x, 0.61, 1.9, 2542, 0.3) + np.random.default_rng(3).normal(0, 0.01, x.size)
    cur = RunCurve(x, y, fit_sigmoid(x, y, min_compute=0.0, seed=3, bootstrap=200))
    from scalectl.present.plot import identified

    lo, hi = cur.fit.interval("A")
    assert identified(cur.fit) and hi > max(y.max(), cur.fit.A) + 0.03       # the interval reaches past the data
    for baseline in ("r", None):
        fig = curves_figure({"r": cur}, baseline=baseline)
        _readable(fig, "GPU-hours")
        ax, strip = fig.axes
        y0, y1 = ax.get_ylim()
        assert y0 <= lo and hi <= y1
        assert not [ln for ln in strip.lines if ln.get_marker() in ("^", "v")]
        assert not [t for t in ax.texts if "lies above the axes" in t.get_text()]


def test_a_short_runs_ceiling_above_the_axes_is_written_there():
    """`scalectl run`'s figure of a short run: its ceiling (not identified) lies above the y
    limits; the figure says where, with the interval, in the run's colour."""
    short = _short(0.9, 1.2, 2542, 5, reach=0.7)
    fig = curves_figure({"short": short}, baseline="short", margin=0.02)
    ax = fig.axes[0]
    assert short.fit.A > ax.get_ylim()[1]
    (text,) = [t for t in ax.texts if "lies above the axes" in t.get_text()]
    assert text.get_text() == (f"short: ceiling A {format_estimate(short.fit.A, short.fit.interval('A'))} lies above "
                               "the axes (not identified: extend the run)")
    assert text.get_color() == style.color(0)
    assert style.text_outside(fig) == []


def test_the_step_zero_point_is_drawn_at_the_left_edge(runs):
    cur = runs["scalerl"]
    assert cur.compute[0] == 0.0
    fig = curves_figure({"scalerl": cur})
    fig.canvas.draw()
    ax = fig.axes[0]
    pts = _points_of(ax)
    at_edge = pts[np.isclose(pts[:, 0], ax.get_xlim()[0])]
    assert at_edge[:, 1].tolist() == pytest.approx([cur.pass_rate[0]])


def test_a_ceiling_on_its_bound_is_not_drawn_as_a_ceiling(runs):
    """A fit whose A sits on the bound 1.0 gets no dashed ceiling line and says so in its label."""
    from scalectl.curve.simulated import draw_points, eval_steps, parse_spec
    from scalectl.present.plot import a_on_bound

    # the sim-demo variant at 100 steps (1 x C_mid), seed 1: its fit puts A on the bound 1.0
    pts = draw_points(parse_spec("simulated:A=0.54,B=1.6,C_mid=0.1"), 1, eval_steps(100, 10))
    x, y = (np.array([p[k] for p in pts]) for k in ("gpu_hours", "pass_rate"))
    short = RunCurve(x, y, fit_sigmoid(x, y, min_compute=0.0, seed=0, bootstrap=200))
    assert a_on_bound(short.fit) and short.fit.A == pytest.approx(1.0)
    fig = curves_figure({"short": short})
    _readable(fig, "GPU-hours")
    ax = fig.axes[0]
    flat = [ln for ln in ax.lines if len(set(np.round(ln.get_ydata(), 9))) == 1 and len(ln.get_ydata()) == 2]
    assert not flat                                  # no axhline at all: A is only a bound here
    assert "(on its bound)" in fig.legends[0].get_texts()[0].get_text()
    assert ax.get_ylim()[1] < 0.9


def test_the_extrapolation_band_is_smooth_and_the_figure_readable():
    """The band's edges rise with the curves they are drawn from (each bootstrap curve with
    one noise draw): no jagged edges, and every text inside the canvas."""
    x = np.linspace(0, 100_000, 81)
    y = sigmoid(x, 0.645, 1.70, 10909, 0.3) + np.random.default_rng(0).normal(0, 0.005, x.size)
    ex = extrapolate(x, y, fraction=0.5, min_compute=1500, bootstrap=300)
    keep = x <= ex.cut
    fig = extrapolation_figure(ex, name="8B batch 2048", fitted_compute=x[keep], fitted_pass_rate=y[keep])
    _readable(fig, "GPU-hours")
    grid = np.geomspace(ex.cut, 120_000, 200)
    lo, hi = ex.fit.band(grid, kind="prediction", drift_sd=ex.drift_sd)
    assert np.all(np.diff(lo) >= -1e-12) and np.all(np.diff(hi) >= -1e-12)
    assert "GPU-hours" in fig.axes[0].get_title()


def test_leave_one_out_lines_are_in_compute_units_with_each_runs_own_fit(runs):
    """Compute on a log axis in its units (not natural-log units); each line's B with A shared
    beside the run's own B."""
    two = {k: v for k, v in runs.items() if k != "unstable"}
    lines = loo_lines(two)
    fig = loo_figure(lines, axis="gpu_hours", fits={n: c.fit for n, c in two.items()})
    _readable(fig, "GPU-hours")
    ax = fig.axes[0]
    pts = _points_of(ax)
    assert pts[:, 0].tolist() == pytest.approx(np.concatenate([np.exp(ln.log_c) for ln in lines]).tolist())
    assert ax.get_yscale() == "log" and (pts[:, 1] > 0).all()
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    for ln in lines:
        own = two[ln.name].fit
        assert any(t.startswith(f"{ln.name}: B {ln.B:.2f}") and f"own fit: A {own.A:.3f}, B {own.B:.2f}" in t
                   for t in texts)


def test_truncation_figure_is_readable():
    x = np.linspace(0.0, 2.0, 21)
    fig = truncation_figure({"base": [(x, 0.02 + 0.01 * x)], "loo-lp": [(x, 0.05 * x), (x, 0.06 * x)]},
                            axis="flops")
    _readable(fig, "FLOPs")
    ax = fig.axes[0]
    assert ax.get_ylim()[1] >= 0.12
    fig.canvas.draw()
    pts = _points_of(ax)                                  # the step-0 rates, at the left edge
    at_edge = pts[np.isclose(pts[:, 0], ax.get_xlim()[0])]
    assert sorted(at_edge[:, 1].tolist()) == pytest.approx([0.0, 0.0, 0.02])
    assert "diamonds at the left edge: compute 0 (step 0)" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_a_margin_band_off_the_axes_says_where_it_is(runs):
    """The baseline's ceiling is not identified, so the y limits leave it out, and its margin
    band with it: the legend's entry says the band lies above the axes instead of naming a
    band the reader cannot find."""
    short = _short(0.9, 1.2, 2542, 5, reach=0.7)                 # fitted A about 0.75, points to 0.53
    assert short.fit.has_flag("ceiling_not_identified") and short.fit.A > short.pass_rate.max() + 0.1
    fig = curves_figure({"short": short}, baseline="short", margin=0.02)
    fig.canvas.draw()
    ax = fig.axes[0]
    a = short.fit.A
    assert a - 0.02 > ax.get_ylim()[1]                         # the band is above the axes
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"short ceiling +-0.02 (above the axes, at {a:.2f})" in texts
    fig = curves_figure(runs, baseline="scalerl", margin=0.02)  # an identified ceiling: in view
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "scalerl ceiling +-0.02" in texts


def test_the_extrapolation_figure_names_the_cut_the_command_prints():
    """Points every 5 GPU-hours to 390, half of them fitted: the cut is the point at 195, and the
    figure's title and cut line say 195 as `scalectl extrapolate` does (not a rounded 200)."""
    from scalectl.present.tables import extrapolation_lines

    x = np.arange(0.0, 391.0, 5.0)
    y = sigmoid(x, 0.6, 1.8, 120.0, 0.3) + np.random.default_rng(4).normal(0, 0.005, x.size)
    ex = extrapolate(x, y, fraction=0.5, min_compute=0.0, bootstrap=100)
    assert ex.cut == 195.0
    line = extrapolation_lines("r", "gpu_hours", ex)[0]
    assert line.startswith("r: fitted on gpu_hours <= 195 (")
    fig = extrapolation_figure(ex, name="r")
    assert fig.axes[0].get_title().startswith("r: fitted on compute <= 195 GPU-hours, held-out error")
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "cut at 195 GPU-hours" in labels and not any("200" in t for t in labels)


def test_the_loo_figure_says_when_each_run_keeps_its_own_ceiling(runs):
    """scalerl (A 0.61) and unstable (A about 0.53): their ceilings differ by more than the margin,
    so the lines keep their own A and the figure says so, with the spread; within the margin the
    title names the one shared A."""
    two = {k: runs[k] for k in ("scalerl", "unstable")}
    a = sorted(c.fit.A for c in two.values())
    assert a[1] - a[0] > 0.02
    fig = loo_figure(loo_lines(two, margin=0.02), fits={n: c.fit for n, c in two.items()}, margin=0.02)
    _readable(fig, "GPU-hours")
    title = " ".join(fig.axes[0].get_title().split())
    assert (f"their ceilings differ by {a[1] - a[0]:.3f}, {a[0]:.3f} to {a[1]:.3f}, more than the margin 0.02: "
            "one shared A would change their B") in title
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    for name, cur in two.items():
        assert any(t.startswith(f"{name}: B ") and t.endswith(f"with its own A {cur.fit.A:.3f}") for t in texts)
    assert "each run's own A" in fig.axes[0].get_ylabel()
    close = {k: runs[k] for k in ("scalerl", "minimax")}
    shared = loo_lines(close, margin=0.02)
    fig = loo_figure(shared, fits={n: c.fit for n, c in close.items()}, margin=0.02)
    assert f"one shared ceiling A = {shared[0].A:.3f}" in " ".join(fig.axes[0].get_title().split())


def test_run_summary_of_a_run_short_of_the_rule_gives_the_command_that_extends_it(tmp_path, db_path):
    """Points to 3 x C_mid, short of the rule's 5 x: the advice extends the run, and the line after
    it is the command that does, to the step the advice names."""
    import numpy as np

    from scalectl.curve import sigmoid
    from scalectl.present.summary import summarize_run
    from scalectl.store.database import Store

    x = np.linspace(0.0, 3 * 2500.0, 31)
    y = sigmoid(x, 0.61, 1.9, 2500.0, 0.3) + np.random.default_rng(3).normal(0, 0.003, x.size)
    with Store.open(db_path) as store:
        rid = store.create_run("short-s1")
        store.add_points(rid, [{"step": 10 * i, "gpu_hours": float(c), "pass_rate": float(p)}
                               for i, (c, p) in enumerate(zip(x, y))])
        lines, _ = summarize_run(store, rid, tmp_path / "curve.png")
    advice = next(ln for ln in lines if ln.startswith("advice: "))
    to_step = int(advice.split("(to step ")[1].split(";")[0].split(")")[0].replace(",", ""))
    # 5 x C_mid at 250 GPU-hours per 10 steps: about step 500 (the fitted C_mid, not the true one)
    assert 400 <= to_step <= 600
    assert lines[lines.index(advice) + 1] == f"extend it: scalectl run --resume short-s1 --set budget.steps={to_step}"
