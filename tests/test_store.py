"""The SQLite store on real files: replace-not-duplicate, concurrency, crashes, migrations."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli
from scalectl.errors import UserError
from scalectl.store.database import SCHEMA_VERSION, Store


def test_points_replace_not_duplicate(db_path):
    with Store.open(db_path) as store:
        run = store.create_run("r1", recipe={"a": 1}, recipe_hash="abc", seed=0)
        store.add_point(run, {"step": 0, "pass_rate": 0.3, "gpu_hours": 0.0, "correct_counts": [1, 2, 0]})
        store.add_point(run, {"step": 10, "pass_rate": 0.4, "gpu_hours": 1.5})
        store.add_point(run, {"step": 10, "pass_rate": 0.45, "gpu_hours": 1.5})
        pts = store.points(run)
    assert [(p["step"], p["pass_rate"]) for p in pts] == [(0, 0.3), (10, 0.45)]
    assert pts[0]["correct_counts"] == [1, 2, 0]


def test_schema_version_and_wal(db_path):
    Store.open(db_path).close()
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(UserError, match="newer than this scalectl understands"):
        Store.open(db_path)


def test_unknown_run_and_duplicate_name(db_path):
    with Store.open(db_path) as store:
        store.create_run("x")
        with pytest.raises(UserError, match="exists already"):
            store.create_run("x")
        with pytest.raises(UserError, match="no run 'nope'"):
            store.get_run("nope")


WRITER = r"""
import sys
from scalectl.store.database import Store
db, run_id, worker, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store = Store.open(db)
for i in range(n):
    store.add_point(run_id, {"step": worker * 100000 + i, "pass_rate": 0.5, "gpu_hours": float(i)})
"""


def test_concurrent_writers_lose_no_row(db_path):
    with Store.open(db_path) as store:
        run = store.create_run("shared")
    workers, per_worker = 6, 150
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(db_path), str(run), str(w), str(per_worker)])
             for w in range(workers)]
    assert [p.wait(timeout=120) for p in procs] == [0] * workers
    with Store.open(db_path) as store:
        steps = [p["step"] for p in store.points(run)]
    assert len(steps) == workers * per_worker
    assert sorted(steps) == sorted(w * 100000 + i for w in range(workers) for i in range(per_worker))


def test_kill_9_mid_import_leaves_no_partial_run(db_path, tmp_path):
    big = tmp_path / "big.jsonl"
    with big.open("w") as fh:
        for i in range(400_000):
            fh.write(json.dumps({"step": i, "gpu_hours": i * 0.1, "pass_rate": 0.5}) + "\n")
    with Store.open(db_path) as store:
        keep = store.create_run("keep")
        store.add_point(keep, {"step": 0, "pass_rate": 0.25})
    proc = subprocess.Popen([str(Path(sys.executable).parent / "scalectl"), "import", str(big),
                             "--name", "big", "--db", str(db_path)], stderr=subprocess.PIPE)
    # wait until the writer holds the write lock (the -wal file grows), then kill it
    wal = Path(str(db_path) + "-wal")
    deadline = time.time() + 60
    while time.time() < deadline and not (wal.exists() and wal.stat().st_size > 1_000_000):
        time.sleep(0.05)
    assert proc.poll() is None, "import finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with Store.open(db_path) as store:
        assert [r["name"] for r in store.list_runs()] == ["keep"]
        assert store.db.execute("SELECT COUNT(*) FROM eval_points").fetchone()[0] == 1
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_import_cli_and_show(db_path, tmp_path):
    csv = tmp_path / "curve.csv"
    csv.write_text("compute,pass_rate,truncation_rate\n0,0.30,0.0\n1000,0.41,0.01\n2000,0.50,0.02\n")
    res = run_cli("import", str(csv), "--name", "paper-run", "--json", db=db_path, check=True)
    assert json.loads(res.stdout)["points"] == 3
    shown = json.loads(run_cli("show", "paper-run", "--json", db=db_path, check=True).stdout)
    assert [(p["step"], p["gpu_hours"], p["pass_rate"]) for p in shown["points"]] == \
        [(0, 0.0, 0.30), (1, 1000.0, 0.41), (2, 2000.0, 0.50)]
    listed = json.loads(run_cli("runs", "--json", db=db_path, check=True).stdout)
    assert listed[0]["name"] == "paper-run" and listed[0]["n_points"] == 3
    assert listed[0]["last_pass_rate"] == 0.5
    human = run_cli("runs", db=db_path, check=True)
    assert "paper-run" in human.stdout


@pytest.mark.parametrize("content,message", [
    ("compute,pass_rate\n0,0.3\n10,abc\n", "row 2: pass_rate = 'abc' is not a number"),
    ("compute,pass_rate\n0,0.3\n10,1.7\n", "row 2: pass_rate = '1.7' must be in [0, 1]"),
    ("pass_rate\n0.3\n", "row 1: needs a compute column"),
    ("compute,pass_rate,colour\n0,0.3,red\n", "row 1: unknown column(s) colour"),
])
def test_bad_import_rows_are_refused_whole(db_path, tmp_path, content, message):
    f = tmp_path / "bad.csv"
    f.write_text(content)
    res = run_cli("import", str(f), "--name", "bad", db=db_path)
    assert res.returncode == 2
    assert message in res.stderr
    with Store.open(db_path) as store:
        assert store.list_runs() == []


def test_hostile_import_name_refused(db_path, tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("compute,pass_rate\n0,0.3\n")
    for name in ("x; rm -rf ~", "../../etc"):
        res = run_cli("import", str(f), "--name", name, db=db_path)
        assert res.returncode == 2 and "is not allowed" in res.stderr
