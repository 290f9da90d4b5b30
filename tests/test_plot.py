"""Figures are written as valid PNG and SVG files (scalectl.present.plot)."""

import math
import xml.etree.ElementTree as ET

import matplotlib.image
import numpy as np
import pytest

from scalectl.science.compare import RunCurve, loo_lines
from scalectl.curve import fit_sigmoid, sigmoid
from scalectl.science.extrapolate import extrapolate
from scalectl.present.plot import curves_figure, plot_curves, plot_extrapolation, plot_loo

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
    check_svg(svg, "scalerl-s0: A 0.61", "scalerl-s0: 95% interval of A", "scalerl-s0 ceiling +-0.02")
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
    check_png(tmp_path / "curve.png")
    assert abs(data["fit"]["A"] - 0.61) < 0.01
    assert none_lines[0].startswith("fit: not yet possible:") and "error" in none_data
    assert not (tmp_path / "none.png").exists()


def test_a_log_compute_axis_labels_do_not_run_into_each_other():
    """1.4 decades of compute (2.7e11 .. 7e12, as a 400-step tiny run): matplotlib alone
    labelled 2e11, 3e11, 4e11, 6e11, ..., which ran into each other; the axis labels the
    1, 2 and 5 multiples there, and over two decades or more the powers of 10 alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from scalectl.present.plot import _log_x

    def labelled(lo, hi):
        fig = Figure()
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.plot([lo, hi], [0.3, 0.6])
        _log_x(ax)
        fig.canvas.draw()
        ticks = ax.xaxis.get_ticklabels() + ax.xaxis.get_ticklabels(minor=True)
        return sorted(round(t.get_position()[0] / 10 ** math.floor(math.log10(t.get_position()[0])), 6)
                      for t in ticks if t.get_text() and lo <= t.get_position()[0] <= hi)

    assert labelled(2.7e11, 7e12) == [1.0, 2.0, 5.0, 5.0]           # 5e11, 1e12, 2e12, 5e12
    assert labelled(1e10, 1e13) == [1.0, 1.0, 1.0, 1.0]             # 1e10, 1e11, 1e12, 1e13


def test_legend_sits_below_the_axes_and_the_margin_band_stops_at_one(runs):
    """The legend is the figure's, below the axes (over them it hid a run's points), and
    the +-margin band around a ceiling at 1 is drawn from 1 - margin to 1, not above 1."""
    at_one = run(1.0, 1.5, 2542, 5)
    assert at_one.fit.A == pytest.approx(1.0, abs=0.02)
    fig = curves_figure({"top": at_one, **runs}, baseline="top", margin=0.02)
    fig.canvas.draw()
    (ax,) = fig.axes
    assert ax.get_legend() is None and len(fig.legends) == 1
    renderer = fig.canvas.get_renderer()
    legend, axes = fig.legends[0].get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.y1 <= axes.y0                              # display y grows upwards
    band = next(p for p in ax.patches if p.get_label() == "top ceiling +-0.02")
    y_data = ax.transData.inverted().transform(band.get_window_extent(renderer).get_points())[:, 1]
    assert y_data.max() == pytest.approx(1.0, abs=1e-9)
    assert y_data.min() == pytest.approx(min(at_one.fit.A, 1.0) - 0.02, abs=1e-9)
