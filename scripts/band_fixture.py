"""Write the evaluation points of stored runs as the JSON fixture of the band test.

    python scripts/band_fixture.py STORE.db OUT.json --command "scalectl run scalerl --seed 0" ...
        --commit SHA --date 2026-12-01 [--note "..."] [--also-db OTHER.db ...] [--prefix P ...] [RUN ...]

Keeps per run: name, recipe hash, seed, status, the recipe's ``fit`` section
(axis and window start, which ``scalectl extrapolate`` uses) and for each point
step, flops, gpu_hours, tokens, pass_rate, truncation_rate, wall_seconds, the
per-prompt correct counts out of k samples, and the standard error of that
evaluation computed from them (:func:`scalectl.curve.evaluation_standard_error`).
Nothing else of the store is copied.  One point per line, so that a diff of the
file stays readable.  Runs without points are left
out; RUN names restrict the runs written.  Runs of separate stores that share a name (each
fresh clone's ``make run`` is ``scalerl-s0``) are told apart by ``--prefix``, one per store in
the order DB, then each ``--also-db``: ``--prefix c1`` writes ``c1-scalerl-s0``.  Two runs
written under one name are refused.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scalectl.curve import evaluation_standard_error
from scalectl.store.database import Store

POINT_KEYS = ("step", "flops", "gpu_hours", "tokens", "pass_rate", "truncation_rate", "wall_seconds")


def run_record(store: Store, info: dict) -> dict | None:
    """One run of the fixture (a JSON-ready dict), or None when it has no points."""
    pts = store.points(info["id"])
    if not pts:
        return None
    recipe = info.get("recipe") or {}
    points = []
    for p in pts:
        counts = p.get("correct_counts") or []
        k = p.get("samples_per_prompt") or 0
        row = {key: p.get(key) for key in POINT_KEYS}
        row.update(se=evaluation_standard_error(counts, k), k=k or None, correct_counts=counts or None)
        points.append(row)
    return {"name": info["name"], "recipe_hash": info["recipe_hash"], "seed": info.get("seed"),
            "status": info["status"], "recipe_name": recipe.get("name"),
            "fit": recipe.get("fit") or {}, "points": points}


def dumps(data: dict) -> str:
    """The fixture as JSON text: indented, except that each point takes one line."""
    points = {}
    for i, run in enumerate(data["runs"]):
        for j, p in enumerate(run["points"]):
            points[f"@point {i} {j}@"] = json.dumps(p, separators=(",", ":"))
    text = json.dumps({**data, "runs": [{**run, "points": [f"@point {i} {j}@" for j in range(len(run["points"]))]}
                                        for i, run in enumerate(data["runs"])]}, indent=1)
    for key, line in points.items():
        text = text.replace(json.dumps(key), line)
    return text + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("out")
    ap.add_argument("runs", nargs="*", help="run names to write (default: every run with points)")
    ap.add_argument("--command", action="append", required=True, dest="commands",
                    help="a command the runs were made with (repeatable)")
    ap.add_argument("--commit", required=True, help="the commit of scalectl that made the runs")
    ap.add_argument("--date", required=True, help="when the runs were made")
    ap.add_argument("--note", default="", help="anything else about how they were made")
    ap.add_argument("--also-db", action="append", default=[], dest="more_dbs",
                    help="another store whose runs are written too, after those of DB (repeatable)")
    ap.add_argument("--prefix", action="append", default=[], dest="prefixes",
                    help="a prefix for the names of one store's runs, in the order DB, then each --also-db "
                         "(repeatable; as many as stores)")
    args = ap.parse_args()
    dbs = [args.db, *args.more_dbs]
    if args.prefixes and len(args.prefixes) != len(dbs):
        raise SystemExit(f"--prefix given {len(args.prefixes)} times for {len(dbs)} stores: give one per store")
    runs = []
    for i, db in enumerate(dbs):
        with Store.open(db, create=False) as store:
            for info in store.list_runs():
                if args.runs and info["name"] not in args.runs:
                    continue
                rec = run_record(store, info)
                if rec is not None:
                    if args.prefixes:
                        rec["name"] = f"{args.prefixes[i]}-{rec['name']}"
                    runs.append(rec)
    names = [r["name"] for r in runs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise SystemExit(f"runs of several stores share the names {', '.join(twice)}: give --prefix once per store")
    made = {"commands": args.commands, "commit": args.commit, "date": args.date, "note": args.note}
    Path(args.out).write_text(dumps({"made": made, "runs": runs}))
    print(f"wrote {len(runs)} runs to {args.out}")


if __name__ == "__main__":
    main()
