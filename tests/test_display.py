"""Numbers for people (scalectl.display) and tables that fit an 80-column terminal."""

import re

import numpy as np
import pytest

from conftest import run_cli
from scalectl.curve import sigmoid
from scalectl.display import Column, fit_columns, format_compute, format_estimate, format_number
from scalectl.store.database import Store


@pytest.mark.parametrize("value,interval,text", [
    # a lopsided C_mid interval: rounded on the log scale, scientific past 1e5
    (4816.0, (3778.0, 103143.0), "4.8e3 [3.8e3, 1.0e5]"),
    # two significant digits of the estimate survive a wide interval
    (2563.0, (1912.0, 8950.0), "2600 [1900, 9000]"),
    # C_mid in FLOPs
    (2.1e12, (1.02e12, 1.43e13), "2.1e12 [1.0e12, 1.4e13]"),
    (1.2346e12, (1.2e12, 1.27e12), "1.23e12 [1.20e12, 1.27e12]"),
    # a symmetric interval: rounded at the leading digit of its half-width
    (0.6123, (0.598, 0.627), "0.61 [0.60, 0.63]"),
    (1.9, (1.8, 2.0), "1.9 [1.8, 2.0]"),
    (2561.0, (2500.0, 2700.0), "2560 [2500, 2700]"),
    (3e-4, (1e-4, 5e-4), "3.0e-4 [1.0e-4, 5.0e-4]"),
    (0.6123, (0.6101, 0.6149), "0.612 [0.610, 0.615]"),
    (2542.3, (2210.0, 2860.0), "2500 [2200, 2900]"),
    # an estimate on its bound (a ceiling A of 1 - 4e-14): no digits from the ~0 near side
    (0.99999999999996, (0.70, 1.0), "1.0 [0.70, 1.0]"),
])
def test_format_estimate(value, interval, text):
    assert format_estimate(value, interval) == text


def test_format_estimate_never_below_two_significant_digits_nor_finer_than_the_interval():
    rng = np.random.default_rng(0)
    for _ in range(500):
        v = 10 ** rng.uniform(-2, 13)
        lo, hi = v * (1 - 10 ** rng.uniform(-3, -0.05)), v * (1 + 10 ** rng.uniform(-3, 1.5))
        est = format_estimate(v, (lo, hi)).split(" [")[0]
        digits = re.sub(r"e-?\d+$", "", est).replace(".", "").lstrip("0")
        assert len(digits) >= 2, (v, lo, hi, est)
        # the printed estimate is within half its own last digit of the value (rounding only)
        assert float(est) == pytest.approx(v, rel=0.05)


def test_format_number_and_compute():
    assert format_number(2542.3) == "2540"
    assert format_number(2.1e12) == "2.10e12"
    assert format_compute(12710.4) == "12,710"
    assert format_compute(3.6e21) == "3.60e21"
    assert format_estimate(0.61, None) == "0.61 (no interval)"
    assert format_estimate(2.1e12, None) == "2.10e12 (no interval)"


def test_one_formatter_for_numbers_and_table_cells():
    """format_number(decimals=True) is the cell of the run tables (runs, show, status, an
    ablation's runs): decimal places in fixed notation, Python's g past the same thresholds as
    the significant-digit form, a step count as it is, None as '-'."""
    assert format_number(0.61234, decimals=True) == "0.612" == format_number(0.61234)
    assert format_number(12.5, decimals=True) == "12.500" and format_number(12.5) == "12.5"
    assert format_number(0.04, 4, decimals=True) == "0.0400"
    assert format_number(99999.0, decimals=True) == "99999.000" and format_number(99999.0) == "100000"
    assert format_number(1e5, decimals=True) == "1e+05" and format_number(1e5) == "1.00e5"    # SCI_FROM
    assert format_number(0.001, decimals=True) == "0.001"
    assert format_number(0.00099, decimals=True) == "0.00099" and format_number(0.00099) == "9.90e-4"  # SCI_BELOW
    assert format_number(2.1e12, decimals=True) == "2.1e+12"
    assert format_number(120, decimals=True) == "120" and format_number(123456, decimals=True) == "123456"
    assert format_number(None, decimals=True) == format_number(None) == "-"
    assert format_number(0.0, decimals=True) == "0" == format_number(-0.0)
    assert format_number(float("nan"), decimals=True) == "nan"


def test_fit_columns_drops_lowest_priority_first_and_keeps_kept_ones():
    cols = [Column("run", keep=True), Column("x", priority=0), Column("y", priority=5),
            Column("A", keep=True)]
    rows = [["a-long-run-name", "1" * 30, "2" * 30, "0.61 [0.60, 0.63]"]]
    assert fit_columns(cols, rows, 200) == [0, 1, 2, 3]
    assert fit_columns(cols, rows, 80) == [0, 2, 3]     # 19 + 33 + 21 + 1 = 74 <= 80
    assert fit_columns(cols, rows, 40) == [0, 3]        # kept even if they alone were too wide


@pytest.fixture
def narrow_db(db_path):
    with Store.open(db_path) as store:
        for name, a, seed in (("scalerl-long-name-s0", 0.61, 1), ("grpo-long-name-s1", 0.55, 2)):
            run_id = store.create_run(name, hardware="H100", recipe_hash=f"h-{name}")
            x = np.linspace(0.0, 5 * 2542, 41)
            y = sigmoid(x, a, 1.9, 2542, 0.3) + np.random.default_rng(seed).normal(0, 0.005, x.size)
            store.add_points(run_id, [{"step": 10 * i, "gpu_hours": float(c), "pass_rate": float(p)}
                                      for i, (c, p) in enumerate(zip(x, y))])
    return db_path


@pytest.mark.parametrize("args", [("runs",), ("fit", "scalerl-long-name-s0", "grpo-long-name-s1"),
                                  ("extrapolate", "scalerl-long-name-s0", "--fraction", "0.5"),
                                  ("compare", "scalerl-long-name-s0", "grpo-long-name-s1")])
def test_tables_show_names_and_ceilings_in_80_columns(narrow_db, args):
    proc = run_cli(*args, db=narrow_db, env={"COLUMNS": "80"}, check=True)
    lines = proc.stdout.splitlines()
    table = [ln for ln in lines if ln.startswith(("│", "┃"))]
    assert table and max(len(ln) for ln in table) <= 80
    assert "…" not in proc.stdout
    if args[0] != "extrapolate":
        assert "scalerl-long-name-s0" in proc.stdout and "grpo-long-name-s1" in proc.stdout
    if args[0] != "runs":
        # A with its interval, whole, in a table cell
        assert re.search(r"│ +0\.\d+ \[0\.\d+, 0\.\d+\] +│", proc.stdout), proc.stdout


def test_show_drops_columns_instead_of_cutting_cells(narrow_db):
    """`show` in 50 columns: step and pass rate whole in every row, the dropped columns named."""
    proc = run_cli("show", "scalerl-long-name-s0", db=narrow_db, env={"COLUMNS": "50"}, check=True)
    table = [ln for ln in proc.stdout.splitlines() if ln.startswith(("│", "┃"))]
    assert table and max(len(ln) for ln in table) <= 50 and "…" not in proc.stdout
    header = [c.strip() for c in table[0].strip("┃").split("┃")]
    assert header[0] == "step" and "pass rate" in header and len(header) < 9
    assert "not shown (narrow terminal): " in proc.stdout
    rows = [[c.strip() for c in ln.strip("│").split("│")] for ln in table[1:]]
    assert [int(r[0]) for r in rows] == [10 * i for i in range(41)]
    with Store.open(narrow_db) as store:
        stored = [p["pass_rate"] for p in store.points(store.get_run("scalerl-long-name-s0")["id"])]
    assert [float(r[header.index("pass rate")]) for r in rows] == pytest.approx(stored, abs=5e-4)


def test_fit_columns_takes_back_a_narrow_column_dropped_before_a_wide_one():
    cols = [Column("run", keep=True), Column("B", priority=1), Column("C_mid", priority=2),
            Column("A", keep=True)]
    rows = [["run-s0", "1.9 [1.8, 2.0]", "2600 [1900, 9000] and more text", "0.61 [0.60, 0.63]"]]
    # widths (cell + 3): run 9, B 17, C_mid 34, A 20; all four need 81 > 80; without B, 64 fits
    assert fit_columns(cols, rows, 80) == [0, 2, 3]
    # at 60: B goes, then C_mid (64 > 60); B comes back: 9 + 17 + 20 + 1 = 47 <= 60
    assert fit_columns(cols, rows, 60) == [0, 1, 3]
