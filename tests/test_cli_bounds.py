"""Every numeric option of every command is bounded at the command line: a value out of range,
or not finite, is a usage error naming the option (exit status 2, no traceback), before the
store or any file is touched."""

from __future__ import annotations

import pytest
from conftest import run_cli
from typer.testing import CliRunner

from scalectl import cli

#: (command line, option named in the error).  Each value lies just outside the option's
#: range, or is nan / inf.
CASES = [
    *[(["fit", "r", "--margin", v], "--margin") for v in ("0", "nan", "-0.1", "inf", "1")],
    (["fit", "r", "--bootstrap", "100000000"], "--bootstrap"), (["fit", "r", "--bootstrap", "-1"], "--bootstrap"),
    *[(["fit", "r", "--level", v], "--level") for v in ("0", "1", "nan")],
    (["fit", "r", "--seed", "-1"], "--seed"), (["fit", "r", "--seed", str(2**32)], "--seed"),
    (["fit", "r", "--min-compute", "-1"], "--min-compute"), (["fit", "r", "--min-compute", "nan"], "--min-compute"),
    *[(["fit", "r", "--r0", v], "--r0") for v in ("nan", "2", "abc")],
    *[(["compare", "--margin", v], "--margin") for v in ("0", "nan", "-0.1", "wide")],
    (["compare", "--bootstrap", "100000000"], "--bootstrap"), (["compare", "--min-compute", "inf"], "--min-compute"),
    *[(["extrapolate", "r", "--fraction", v], "--fraction") for v in ("0", "1.5", "nan")],
    *[(["extrapolate", "r", "--until", v], "--until") for v in ("0", "-5", "inf")],
    (["extrapolate", "r", "--drift-sd", "-0.1"], "--drift-sd"), (["extrapolate", "r", "--drift-sd", "nan"], "--drift-sd"),
    (["extrapolate", "r", "--bootstrap", "100000000"], "--bootstrap"), (["extrapolate", "r", "--r0", "nan"], "--r0"),
    (["margin", "--level", "1"], "--level"), (["margin", "--bootstrap", "100000000"], "--bootstrap"),
    (["margin", "--seed", "-1"], "--seed"),
    (["logs", "r", "--lines", "-1"], "--lines"), (["logs", "r", "--task", "-1"], "--task"),
    (["report", "a", "--margin", "0"], "--margin"), (["report", "a", "--bootstrap", "100000000"], "--bootstrap"),
    (["run", "scalerl", "--seed", "-1"], "--seed"), (["run", "scalerl", "--seed", str(2**32)], "--seed"),
    *[(["status", "--interval", v], "--interval") for v in ("0", "nan", "inf")],
    (["serve", "--port", "70000"], "--port"),
    *[(["ablate", "--leave-one-out", opt, v], opt) for opt, v in (
        ("--budget-steps", "0"), ("--budget-steps", str(10**9 + 1)), ("--repeats", "0"), ("--margin", "nan"),
        ("--bootstrap", "100000000"), ("--poll", "0"), ("--poll", "nan"), ("--rate", "0"), ("--rate", "inf"),
        ("--max-budget", "0"), ("--max-seeds", "0"), ("--total-budget", "-1"), ("--level", "1"))],
]


@pytest.mark.parametrize("args, option", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_numeric_options_are_bounded(args, option, tmp_path):
    db = tmp_path / "none.db"
    result = CliRunner().invoke(cli.build_app(cli.modules_for(args)), [*args, "--db", str(db)]
                                if args[0] not in ("serve",) else args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output, result.output
    assert isinstance(result.exception, SystemExit)             # a usage error, not a crash
    assert not db.exists()                                       # refused before the store


def test_the_console_script_refuses_bad_fit_arguments_without_a_traceback(tmp_path):
    db = tmp_path / "none.db"
    for value, shown in (("0", "0 is out of range; allowed: > 0 and < 1"),
                         ("nan", "nan is not a finite number; allowed: > 0 and < 1"),
                         ("-0.1", "-0.1 is out of range; allowed: > 0 and < 1")):
        proc = run_cli("fit", "r", "--margin", value, "--db", str(db))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert shown in " ".join(proc.stderr.replace("│", " ").split())
    proc = run_cli("fit", "r", "--bootstrap", "100000000", "--db", str(db))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "100000000 is out of range; allowed: 0..100,000" in " ".join(proc.stderr.replace("│", " ").split())
    ok = run_cli("fit", "r", "--margin", "0.03", "--bootstrap", "100000", "--db", str(db))
    assert ok.returncode == 2 and "no store there" in ok.stderr, ok.stderr      # in range: on to the store
    assert not db.exists()


@pytest.mark.parametrize("assume, shown", [("C_mid=nan", "C_mid must be a finite number > 0"),
                                           ("s_fit=-0.01", "s_fit must be a finite number > 0"),
                                           ("compute_per_step=0", "compute_per_step must be a finite number > 0"),
                                           ("s_seed=inf", "s_seed must be a finite number >= 0")])
def test_assumed_values_are_bounded(assume, shown):
    from scalectl.ablation.until_decided import parse_assume
    from scalectl.errors import UserError

    assert parse_assume(["C_mid=0.1,s_seed=0"]) == {"C_mid": 0.1, "s_seed": 0.0}
    with pytest.raises(UserError, match=shown):
        parse_assume([assume])
