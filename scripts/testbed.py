"""The testbed's own checks on the default setup (docs/study.md, "The testbed since 2026-12-07"): whether a
default run identifies its ceiling, the setup's margin from seeds, and the forecast of a fit
to compute not yet spent, each through the ``scalectl`` commands a user types.  Not a test: it
trains for minutes to hours and prints what it measured, with the CPU kind and load beside
every run; every result also goes as one JSON line to ``--results``.

    python scripts/testbed.py identify --runs 10 --label quiet   # 10 default runs (seed 0, the budget)
    python scripts/testbed.py margin --seeds 3                    # ScaleRL on 3 seeds -> scalectl margin
    python scripts/testbed.py margin --names long-s0,long-s1,long-s2 --until-step 750
                                                                  # the margin of stored runs at a budget
    python scripts/testbed.py forecast --runs 3 --steps 2000      # default runs extended to 2,000 steps,
                                                                  # extrapolated from 1/4 and 1/2
    python scripts/testbed.py table                               # every result so far, as a table

Run again after an interruption: runs completed in the store are reused, stopped ones resumed.
Targets (the testbed's promise): every identification run without flags and its A interval
at most 0.04 wide; the margin at most 0.025; a forecast from a quarter or a half of a run with
at least 90 % of the held-out points inside the 95 % band, |mean signed error| <= 0.01 and the
partial fit's A within the margin of the whole run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCALECTL = str(Path(sys.executable).parent / "scalectl")
#: Largest A interval width of an identified default run, and the largest margin (docs/study.md).
WIDTH_TARGET, MARGIN_TARGET = 0.04, 0.025
#: Forecast targets: share of held-out points in the 95 % band, |mean signed error|.
BAND_TARGET, BIAS_TARGET = 0.90, 0.01


def cpu_kind() -> str:
    """The CPU's model name (``AMD EPYC``, ``Intel Xeon ...``): ``benchmarks/common.py``'s."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import cpu_model

    return cpu_model()


def commit() -> str | None:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or None


def scalectl(*args: str, capture: bool = True, check: bool = True) -> subprocess.CompletedProcess:
    """Run one ``scalectl`` command (its output captured, or shown when ``capture`` is False)."""
    print("$ scalectl " + " ".join(args), flush=True)
    proc = subprocess.run([SCALECTL, *args], text=True, capture_output=capture)
    if check and proc.returncode != 0:
        if capture:
            sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(proc.returncode)
    return proc


def statuses(db: str) -> dict[str, str]:
    if not Path(db).exists():
        return {}
    return {r["name"]: r["status"] for r in json.loads(scalectl("status", "--json", "--db", db).stdout)}


def last_step(name: str, db: str) -> int:
    """The step of run ``name``'s last stored evaluation point (0 when it has none)."""
    points = json.loads(scalectl("show", name, "--db", db, "--json").stdout)["points"]
    return max((p["step"] for p in points), default=0)


def train(name: str, args, *extra: str, steps: int | None = None) -> dict:
    """Train (or resume, or reuse) run ``name``; with ``steps``, extend a completed run that ended
    before it to ``steps`` (``scalectl run --resume NAME --set budget.steps=STEPS``).  Returns the
    wall-clock and load around it."""
    status = statuses(args.db).get(name)
    before, t0 = os.getloadavg(), time.monotonic()
    common = ["--runs-dir", args.runs_dir, "--db", args.db]
    raise_to = ["--set", f"budget.steps={steps}"] if steps else []
    if status == "completed" and (steps is None or last_step(name, args.db) >= steps):
        print(f"{name}: completed, reused", flush=True)
        return {"reused": True}
    if status is None:     # a fresh run, as a fresh clone's `make run` trains it: not a stored run of the same seed
        scalectl("run", "scalerl", "--name", name, "--new-run", *extra, *raise_to, *common, capture=False)
    else:
        scalectl("run", "--resume", name, *raise_to, *common, capture=False)
    return {"reused": False, "wall_s": round(time.monotonic() - t0, 1),
            "load_before": [round(x, 2) for x in before], "load_after": [round(x, 2) for x in os.getloadavg()]}


def fit(name: str, db: str) -> dict:
    """The run's stored fit (scalectl fit --json): A with its interval, B, C_mid, flags, and how far
    its last point lies past C_mid."""
    out = json.loads(scalectl("fit", name, "--db", db, "--json").stdout)["fits"][0]
    f = out["fit"]
    points = json.loads(scalectl("show", name, "--db", db, "--json").stdout)["points"]
    last = max(p[f["axis"]] for p in points)
    lo, hi = f["intervals"]["A"]
    return {"A": f["A"], "A_lo": lo, "A_hi": hi, "width": hi - lo, "B": f["B"], "C_mid": f["C_mid"],
            "R0": f["R0"], "flags": [x["code"] for x in f["flags"]], "x_cmid": last / f["C_mid"],
            "first": points[0]["pass_rate"], "last": points[-1]["pass_rate"], "steps": points[-1]["step"]}


def record(args, kind: str, row: dict) -> None:
    row = {"kind": kind, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
           "cpu": cpu_kind(), **row}
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    with open(args.results, "a") as fh:
        fh.write(json.dumps(row, sort_keys=True) + "\n")


def identify(args) -> None:
    """``--runs`` default runs (seed 0, the setup's budget), each as a fresh ``make run`` would
    train it; fitted, and recorded with the machine's CPU kind and load."""
    for k in range(args.runs):
        name = f"id-{args.label}-{k}"
        timing = train(name, args)
        row = {"run": name, "label": args.label, **timing, **fit(name, args.db)}
        if not timing["reused"]:
            record(args, "identify", row)
        print(_identify_line(row), flush=True)


def margin(args) -> None:
    """ScaleRL on ``--seeds`` seeds (the setup's budget): ``scalectl margin`` on them.  With
    ``--names``, the margin of those stored runs instead (no training), read up to
    ``--until-step`` when given (seeds extended past the budget, as the forecast runs are)."""
    names = args.names.split(",") if args.names else []
    for seed in range(0 if names else args.seeds):
        name = f"margin-s{seed}"
        timing = train(name, args, "--seed", str(seed))
        row = {"run": name, "seed": seed, **timing, **fit(name, args.db)}
        if not timing["reused"]:
            record(args, "margin-seed", row)
        names.append(name)
    cut = ["--until-step", str(args.until_step)] if args.until_step else []
    out = json.loads(scalectl("margin", *names, *cut, "--db", args.db, "--json").stdout)
    record(args, "margin", {"runs": names, "until_step": args.until_step, "margin": out})
    print(json.dumps(out, indent=1))


def forecast(args) -> None:
    """``--runs`` default runs (seeds ``--first-seed``, ...), each first trained to the setup's
    budget and scored as an identification run, then extended to ``--steps`` steps and
    extrapolated from its first quarter and its first half (scalectl extrapolate --fraction)."""
    for seed in range(args.first_seed, args.first_seed + args.runs):
        name = f"{args.prefix}{seed}"
        timing = train(name, args, "--seed", str(seed))
        if not timing["reused"]:
            row = {"run": name, "label": "long", **timing, **fit(name, args.db)}
            record(args, "identify", row)
            print(_identify_line(row), flush=True)
        timing = train(name, args, steps=args.steps)
        score_forecast(name, args, timing)


def score_forecast(name: str, args, timing: dict) -> None:
    """Extrapolate run ``name`` from its first quarter and first half; record and print the
    held-out points inside the 95 % band, the mean signed and absolute error, and the partial
    fit's A against the whole run's."""
    whole = fit(name, args.db)
    for fraction in (0.25, 0.5):
        ex = json.loads(scalectl("extrapolate", name, "--fraction", str(fraction), "--db", args.db,
                                 "--json").stdout)
        held = ex["heldout"]
        signed = sum(h["pass_rate"] - h["predicted"] for h in held) / len(held)
        row = {"run": name, "fraction": fraction, **timing, "whole": whole, "A_partial": ex["fit"]["A"],
               "A_partial_interval": ex["fit"]["intervals"]["A"],
               "partial_flags": [f["code"] for f in ex["fit"]["flags"]],
               "share_in_band": ex["share_in_band"], "mean_signed_error": signed,
               "mean_abs_error": ex["mean_abs_error"], "heldout": len(held),
               "dA": ex["fit"]["A"] - whole["A"]}
        record(args, "forecast", row)
        print(_forecast_line(row), flush=True)


def _identify_line(r: dict) -> str:
    ok = not r["flags"] and r["width"] <= WIDTH_TARGET
    return (f"{r['run']:<16} {r['first']:.3f} -> {r['last']:.3f}  A {r['A']:.3f} [{r['A_lo']:.3f}, {r['A_hi']:.3f}] "
            f"width {r['width']:.3f}  B {r['B']:.2f}  {r['x_cmid']:.1f} x C_mid  flags {','.join(r['flags']) or '-'}  "
            f"{'identified' if ok else 'NOT identified'}")


def _forecast_line(r: dict) -> str:
    ok = (r["share_in_band"] >= BAND_TARGET and abs(r["mean_signed_error"]) <= BIAS_TARGET)
    return (f"{r['run']:<16} from {r['fraction']:.2f}: {r['heldout']} held out, {100 * r['share_in_band']:.0f} % in band, "
            f"mean error {r['mean_signed_error']:+.4f} (abs {r['mean_abs_error']:.4f}), A {r['A_partial']:.3f} vs "
            f"{r['whole']['A']:.3f} (dA {r['dA']:+.3f})  {'met' if ok else 'NOT met'}")


def table(args) -> None:
    """Every result recorded so far in ``--results``, one line each, with machine and load."""
    if not Path(args.results).exists():
        print(f"no results yet in {args.results}")
        return
    for line in Path(args.results).read_text().splitlines():
        r = json.loads(line)
        where = f"{r['date'][:16]} {r['commit']} {r['cpu'][:24]}"
        load = f"load {r['load_before'][0]:.1f}->{r['load_after'][0]:.1f}" if "load_before" in r else ""
        wall = f"{r['wall_s'] / 60:.1f} min" if "wall_s" in r else ""
        if r["kind"] == "identify" or r["kind"] == "margin-seed":
            print(f"{where}  {_identify_line(r)}  {wall} {load}")
        elif r["kind"] == "forecast":
            print(f"{where}  {_forecast_line(r)}  {wall} {load}")
        elif r["kind"] == "margin":
            m = r["margin"]
            print(f"{where}  margin of {', '.join(r['runs'])}: {json.dumps(m)[:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["identify", "margin", "forecast", "table"])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--names", default="", help="margin: stored runs (comma list) instead of training seeds")
    parser.add_argument("--until-step", type=int, default=None, help="margin: read the runs up to this step")
    parser.add_argument("--label", default="quiet", help="names the identification runs (quiet, busy, ...)")
    parser.add_argument("--first-seed", type=int, default=0, help="forecast: the first run's seed")
    parser.add_argument("--prefix", default="long-s", help="forecast: run names, PREFIX + seed")
    parser.add_argument("--db", default="build/testbed/testbed.db")
    parser.add_argument("--runs-dir", default="build/testbed/runs")
    parser.add_argument("--results", default="build/testbed/results.jsonl")
    args = parser.parse_args()
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    {"identify": identify, "margin": margin, "forecast": forecast, "table": table}[args.what](args)


if __name__ == "__main__":
    main()
