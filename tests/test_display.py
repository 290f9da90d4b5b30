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


ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: A terminal of 80 columns for CliRunner: rich takes TTY_COMPATIBLE=1 for a terminal.
TERMINAL_80 = {"COLUMNS": "80", "TTY_COMPATIBLE": "1", "TERM": "xterm", "NO_COLOR": "1"}


def at_terminal(args, db, columns: int = 80):
    """``scalectl ARGS`` through CliRunner as at a terminal ``columns`` wide: its stdout, plain."""
    from typer.testing import CliRunner

    from scalectl.cli import app

    result = CliRunner().invoke(app, [*args, "--db", str(db)], env={**TERMINAL_80, "COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return ANSI.sub("", result.stdout)


def table_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(("│", "┃"))]


def header(text: str) -> list[str]:
    return [c.strip() for c in table_lines(text)[0].strip("┃").split("┃")]


def column_text(text: str, name: str) -> str:
    """Every piece of column ``name`` of a drawn table, top to bottom, spaces removed: a cell
    wrapped or folded over several lines reads whole again."""
    i = header(text).index(name)
    return "".join(ln.strip("│").split("│")[i].replace(" ", "")
                   for ln in table_lines(text)[1:] if ln.startswith("│"))


#: Each command's table and its columns, every one of which a pipe shows whole.
PIPED = [
    (("runs",), ["id", "name", "hash", "status", "launcher", "hardware", "points", "last step", "pass rate",
                 "trunc."]),
    (("status",), ["id", "name", "status", "job", "job state", "eval step", "pass rate", "trunc."]),
    (("fit", "scalerl-long-name-s0", "grpo-long-name-s1", "--bootstrap", "100"),
     ["run", "window", "points", "A", "B", "C_mid", "R0", "rmse", "flags"]),
    (("extrapolate", "scalerl-long-name-s0", "--fraction", "0.5", "--bootstrap", "100"),
     ["window", "points", "A", "B", "C_mid", "flags"]),
    (("compare", "scalerl-long-name-s0", "grpo-long-name-s1", "--bootstrap", "100"),
     ["#", "run", "hardware", "A", "B", "C_mid", "dA", "verdict"]),
    (("show", "scalerl-long-name-s0"), ["step", "GPU-hours", "FLOPs", "tokens", "pass rate", "trunc.", "mean len",
                                       "reward", "entropy"]),
]


@pytest.mark.parametrize("args,columns", PIPED, ids=[a[0] for a, _ in PIPED])
def test_tables_in_a_pipe_have_every_column_whole(narrow_db, args, columns):
    """Piped (a log) at COLUMNS=80, a table has every column, one line per row, no cell cut."""
    proc = run_cli(*args, db=narrow_db, env={"COLUMNS": "80"}, check=True)
    assert header(proc.stdout) == columns
    assert "not shown" not in proc.stdout and "…" not in proc.stdout
    if args[0] in ("runs", "status"):
        rows = [[c.strip() for c in ln.strip("│").split("│")] for ln in table_lines(proc.stdout)[1:]]
        with Store.open(narrow_db) as store:
            last = {r["name"]: r for r in store.list_runs()}
        # one line per run (nothing wrapped), each pass rate whole
        assert {r[1]: r[columns.index("pass rate")] for r in rows} == {
            name: f"{r['last_pass_rate']:.3f}" for name, r in last.items()}


def test_compare_in_a_pipe_prints_dA_as_json_has_it(narrow_db):
    """The verdict's own number, dA with its interval, in the piped table at 80 columns: the
    values of --json, rounded."""
    import json

    args = ("compare", "scalerl-long-name-s0", "grpo-long-name-s1", "--bootstrap", "100")
    data = json.loads(run_cli(*args, "--json", db=narrow_db, check=True).stdout)
    other = next(r for r in data["rows"] if r["verdict"] != "baseline")
    lo, hi = other["delta_A_interval"]
    expected = f"{other['delta_A']:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    proc = run_cli(*args, db=narrow_db, env={"COLUMNS": "80"}, check=True)
    row = next(ln for ln in table_lines(proc.stdout) if "grpo-long-name-s1" in ln)
    assert row.strip("│").split("│")[header(proc.stdout).index("dA")].strip() == expected
    assert other["delta_A"] == pytest.approx(-0.06, abs=0.015)      # the simulated ceilings 0.55 vs 0.61


def test_compare_keeps_dA_at_a_narrow_terminal(narrow_db):
    """At an 80-column terminal compare drops columns but never dA; at 50 the kept columns wrap
    at their spaces or fold, and every character of every kept cell is still there."""
    import json

    args = ["compare", "scalerl-long-name-s0", "grpo-long-name-s1", "--bootstrap", "100"]
    data = json.loads(run_cli(*args, "--json", db=narrow_db, check=True).stdout)
    other = next(r for r in data["rows"] if r["verdict"] != "baseline")
    lo, hi = other["delta_A_interval"]
    assert "not shown (narrow terminal): #, hardware, B, C_mid" in at_terminal(args, narrow_db, 80)
    for columns in (80, 50):
        text = at_terminal(args, narrow_db, columns)
        assert max(len(ln) for ln in table_lines(text)) <= columns and "…" not in text
        assert header(text) == ["run", "A", "dA", "verdict"]
        assert column_text(text, "dA") == "-" + f"{other['delta_A']:+.3f}[{lo:+.3f},{hi:+.3f}]"   # baseline: -
        assert column_text(text, "run") == "scalerl-long-name-s0grpo-long-name-s1"
        assert column_text(text, "verdict") == "baseline" + other["verdict"].replace(" ", "")


def test_tables_show_names_and_ceilings_at_an_80_column_terminal(narrow_db):
    for args in (("runs",), ("status",), ("fit", "scalerl-long-name-s0", "grpo-long-name-s1", "--bootstrap", "100")):
        text = at_terminal(args, narrow_db)
        assert max(len(ln) for ln in table_lines(text)) <= 80 and "…" not in text
        assert "scalerl-long-name-s0" in text and "grpo-long-name-s1" in text
        assert ("A" if args[0] == "fit" else "pass rate") in header(text)
    text = at_terminal(["fit", "scalerl-long-name-s0"], narrow_db)
    # A with its interval, whole, in a table cell
    assert re.search(r"│ +0\.\d+ \[0\.\d+, 0\.\d+\] +│", text), text


def test_recipes_in_a_pipe_one_line_per_preset_and_wrapped_at_a_terminal(narrow_db):
    from scalectl import presets

    proc = run_cli("recipes", env={"COLUMNS": "80"}, check=True)
    rows = [[c.strip() for c in ln.strip("│").split("│")] for ln in table_lines(proc.stdout)[1:]]
    described = {r[1]: r[4] for r in rows}
    wanted = {name: presets.description(presets.resolve(name, "recipes")) for name in presets.names("recipes")}
    assert {n: described[n] for n in wanted} == wanted and all(len(d) > 60 for d in wanted.values())
    from typer.testing import CliRunner

    from scalectl.cli import app

    result = CliRunner().invoke(app, ["recipes"], env=TERMINAL_80)
    text = ANSI.sub("", result.stdout)
    assert max(len(ln) for ln in table_lines(text)) <= 80 and "…" not in text
    assert column_text(text, "description").startswith(wanted["dapo"].replace(" ", ""))


def test_csv_format_prints_the_cells_and_only_them(narrow_db):
    import csv
    import io

    proc = run_cli("compare", "scalerl-long-name-s0", "grpo-long-name-s1", "--bootstrap", "100",
                   "--format", "csv", db=narrow_db, env={"COLUMNS": "80"}, check=True)
    rows = list(csv.reader(io.StringIO(proc.stdout)))
    assert rows[0] == ["#", "run", "hardware", "A", "B", "C_mid", "dA", "verdict"]
    assert [r[1] for r in rows[1:]] == ["scalerl-long-name-s0", "grpo-long-name-s1"]
    assert rows[1][6] == "-" and re.fullmatch(r"-0\.0\d\d \[-0\.\d{3}, -0\.\d{3}\]", rows[2][6])
    assert "margin 0.02" in proc.stderr and "margin" not in proc.stdout      # the line under the table
    status = run_cli("status", "--format", "csv", db=narrow_db, check=True)
    assert status.stdout.splitlines()[0] == "id,name,status,job,job state,eval step,pass rate,trunc."
    bad = run_cli("runs", "--format", "xml", db=narrow_db)
    assert bad.returncode == 2 and "'xml' is not one of: table, csv, json" in bad.stderr


def test_kept_columns_wider_than_the_terminal_wrap_instead_of_being_cut():
    """Kept columns alone wider than the width: names (single words) stay whole, estimates wrap
    at their spaces; narrower still, everything folds; no character is lost either way."""
    import io

    from rich.console import Console

    from scalectl.display import fitted_table

    cols = [Column("run", "left", keep=True), Column("A", keep=True), Column("dA", keep=True)]
    rows = [["a-rather-long-run-name", "0.61 [0.60, 0.63]", "+0.012 [-0.004, +0.028]"]]
    for width, whole_name in ((50, True), (30, False)):
        buf = io.StringIO()
        Console(file=buf, width=width, color_system=None).print(fitted_table(None, cols, rows, width))
        text = buf.getvalue()
        assert max(len(ln) for ln in text.splitlines()) <= width
        assert column_text(text, "run") == "a-rather-long-run-name"
        assert column_text(text, "A") == "0.61[0.60,0.63]" and column_text(text, "dA") == "+0.012[-0.004,+0.028]"
        name_lines = sum(bool(ln.strip("│").split("│")[0].strip()) for ln in table_lines(text)[1:])
        assert (name_lines == 1) == whole_name, text


def test_show_drops_columns_instead_of_cutting_cells(narrow_db):
    """`show` at a 50-column terminal: step and pass rate whole in every row, the dropped columns named."""
    text = at_terminal(["show", "scalerl-long-name-s0"], narrow_db, 50)
    table = table_lines(text)
    assert table and max(len(ln) for ln in table) <= 50 and "…" not in text
    head = header(text)
    assert head[0] == "step" and "pass rate" in head and len(head) < 9
    assert "not shown (narrow terminal): " in text
    rows = [[c.strip() for c in ln.strip("│").split("│")] for ln in table[1:]]
    assert [int(r[0]) for r in rows] == [10 * i for i in range(41)]
    with Store.open(narrow_db) as store:
        stored = [p["pass_rate"] for p in store.points(store.get_run("scalerl-long-name-s0")["id"])]
    assert [float(r[head.index("pass rate")]) for r in rows] == pytest.approx(stored, abs=5e-4)


def test_fit_columns_takes_back_a_narrow_column_dropped_before_a_wide_one():
    cols = [Column("run", keep=True), Column("B", priority=1), Column("C_mid", priority=2),
            Column("A", keep=True)]
    rows = [["run-s0", "1.9 [1.8, 2.0]", "2600 [1900, 9000] and more text", "0.61 [0.60, 0.63]"]]
    # widths (cell + 3): run 9, B 17, C_mid 34, A 20; all four need 81 > 80; without B, 64 fits
    assert fit_columns(cols, rows, 80) == [0, 2, 3]
    # at 60: B goes, then C_mid (64 > 60); B comes back: 9 + 17 + 20 + 1 = 47 <= 60
    assert fit_columns(cols, rows, 60) == [0, 1, 3]
