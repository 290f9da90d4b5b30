"""Run journals: a job that may not write the store appends its points and status to its run
folder, and the store takes them in, once each (real files, real SQLite, real processes)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from scalectl.job.body import read_job_file, write_job_file
from scalectl.job.journal import DIRECT, JOURNAL, JobStore, JournalSink, journal_for, store_mode
from scalectl.points import EvalPoint
from scalectl.store.database import Store
from scalectl.store.filesystem import NETWORK_TYPES, file_system, mount_type
from scalectl.store.journal import ingest, journal_files, read_records


def _run(tmp_path, name="r") -> tuple[Path, int, Path]:
    db, run_dir = tmp_path / "s.db", tmp_path / "runs" / name
    with Store.open(db) as store:
        run_id = store.create_run(name, run_dir=str(run_dir), status="pending")
    write_job_file(run_dir, db=str(db), run_id=run_id, recipe={})
    return db, run_id, run_dir


def _point(step: int) -> EvalPoint:
    return EvalPoint(step=step, pass_rate=step / 100, gpu_hours=step * 0.5, flops=step * 1e9,
                     correct_counts=[step % 3, 1])


def test_journaled_points_and_status_are_taken_in_once(tmp_path):
    db, run_id, run_dir = _run(tmp_path)
    out = JobStore(read_job_file(run_dir), run_dir, env={"SCALECTL_STORE_MODE": "journal"})
    assert out.mode == JOURNAL
    out.update_run(status="running", started="2026-12-01T10:00:00+00:00", error=None)
    for step in (0, 2, 4):
        out.sink(_point(step))
    out.sink(EvalPoint(step=4, pass_rate=0.5))               # a step taken again replaces its point
    out.update_run(status="completed", ended="2026-12-01T11:00:00+00:00")
    with sqlite3.connect(db) as conn:                            # nothing reached the SQLite file yet
        assert conn.execute("SELECT COUNT(*) FROM eval_points").fetchone()[0] == 0
    with Store.open(db) as store:
        first = ingest(store)
        again = ingest(store)
        run, points = store.get_run(run_id), store.points(run_id)
    assert (first.points, first.runs, first.skipped, again.points, again.runs) == (4, 2, 0, 0, 0)
    assert [(p["step"], p["pass_rate"], p["gpu_hours"]) for p in points] == [(0, 0.0, 0.0), (2, 0.02, 1.0),
                                                                              (4, 0.5, None)]
    assert points[1]["correct_counts"] == [2, 1]
    assert (run["status"], run["started"], run["ended"], run["error"]) == (
        "completed", "2026-12-01T10:00:00+00:00", "2026-12-01T11:00:00+00:00", None)
    assert [(p["step"], p["pass_rate"]) for p in out.points()] == [(0, 0.0), (2, 0.02), (4, 0.5)]   # what the job sees


def test_records_are_applied_once_even_after_the_store_moved_on(tmp_path):
    """A record is never applied twice: after the host marks the run pending again (a resume),
    taking the journal in again does not bring back its old 'completed'."""
    db, run_id, run_dir = _run(tmp_path)
    sink = JournalSink(str(run_dir), run_id)
    journal_for(run_dir, run_id).append("run", fields={"status": "completed"})
    sink(_point(0))
    with Store.open(db) as store:
        ingest(store)
        store.update_run(run_id, status="pending", error=None)
        ingest(store)
        assert store.get_run(run_id)["status"] == "pending"
        journal_for(run_dir, run_id).append("run", fields={"status": "running"})   # the resumed job's word
        assert ingest(store).runs == 1 and store.get_run(run_id)["status"] == "running"


def test_two_processes_journal_in_their_own_files_and_their_records_apply_in_time_order(tmp_path):
    """The first trainer rank records the run running; a generator that lost it records the
    failure later, in its own file: the failure stands."""
    db, run_id, run_dir = _run(tmp_path)
    journal_for(run_dir, run_id).append("run", fields={"status": "running"})
    code = ("import sys; from scalectl.job.journal import journal_for; "
            "journal_for(sys.argv[1], int(sys.argv[2])).append('run', fields={'status': 'failed', 'error': 'lost'})")
    subprocess.run([sys.executable, "-c", code, str(run_dir), str(run_id)], check=True,
                   env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    files = journal_files(run_dir)
    assert len(files) == 2 and {f.name.rsplit("-", 1)[-1] for f in files} >= {f"{os.getpid()}.jsonl"}
    with Store.open(db) as store:
        ingest(store)
        assert (store.get_run(run_id)["status"], store.get_run(run_id)["error"]) == ("failed", "lost")


WRITER = r"""
import resource, sys
from scalectl.job.journal import JournalSink
from scalectl.points import EvalPoint
run_dir, run_id, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sink = JournalSink(run_dir, run_id)
step = 0
while True:
    sink(EvalPoint(step=step, pass_rate=0.5, correct_counts=list(range(step % 7, 400))))
    step += 1
"""


def _writer(run_dir, run_id, limit=0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir), str(run_id), str(limit)],
                            env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), stderr=subprocess.PIPE)


def _lines(run_dir) -> tuple[list[int], bytes]:
    [path] = journal_files(run_dir)
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    return [json.loads(line)["point"]["step"] for line in whole.splitlines()], data[len(whole):]


def test_a_writer_killed_mid_append_loses_no_whole_point(tmp_path):
    """kill -9 while the writer appends point after point: every whole line is in the store
    after the ingest, once, and a second ingest changes nothing."""
    db, run_id, run_dir = _run(tmp_path)
    proc = _writer(run_dir, run_id)
    deadline = time.monotonic() + 60
    while not journal_files(run_dir) or len(_lines(run_dir)[0]) < 40:
        assert time.monotonic() < deadline and proc.poll() is None, "the writer did not write 40 points"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    steps, tail = _lines(run_dir)
    with Store.open(db) as store:
        ingest(store)
        stored = [p["step"] for p in store.points(run_id)]
        assert ingest(store).points == 0 and [p["step"] for p in store.points(run_id)] == stored
    assert stored == steps == list(range(len(steps)))
    print(f"\n{len(steps)} whole points, a last partial line of {len(tail)} bytes")


def test_a_line_torn_by_a_writer_stopped_mid_write_is_left_out(tmp_path):
    """The writer's file-size limit (RLIMIT_FSIZE) stops it in the middle of a line, as a
    quota or a crash would: the kernel writes part of it and the writer dies.  The torn line
    is never applied; every whole point is, once."""
    db, run_id, run_dir = _run(tmp_path)
    proc = _writer(run_dir, run_id, limit=50_000)
    assert proc.wait(timeout=60) != 0 and b"File too large" in proc.stderr.read()
    steps, tail = _lines(run_dir)
    assert journal_files(run_dir)[0].stat().st_size == 50_000 and 0 < len(tail) and len(steps) >= 10
    records, offset, bad = read_records(journal_files(run_dir)[0])
    assert (len(records), offset, bad) == (len(steps), 50_000 - len(tail), 0)
    with Store.open(db) as store:
        ingest(store)
        assert [p["step"] for p in store.points(run_id)] == steps == list(range(len(steps)))
        assert ingest(store).points == 0


def test_store_mode_direct_only_on_the_stores_host_and_a_local_file_system(tmp_path):
    db, run_id, run_dir = _run(tmp_path)
    job = read_job_file(run_dir)
    assert job["store_host"] == socket.gethostname()
    fs = file_system(tmp_path)
    assert not fs.network and fs.source == "statfs"
    mode, why = store_mode(job, env={})
    assert mode == DIRECT and f"is on {fs.name} (a local file system)" in why
    mode, why = store_mode(dict(job, store_host="login1"), env={})
    assert mode == JOURNAL and why.startswith(f"this job runs on {socket.gethostname()}, the store belongs to login1")
    assert store_mode({k: v for k, v in job.items() if k != "store_host"}, env={})[0] == JOURNAL
    assert store_mode(job, env={"SCALECTL_STORE_MODE": "journal"})[0] == JOURNAL


def test_a_store_on_nfs_is_seen_in_mountinfo():
    # two lines of a real /proc/self/mountinfo: the root on ext4 and a home on NFS 4
    text = ("27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
            "58 27 0:51 / /home/lab rw,relatime shared:30 - nfs4 fs1:/export/home rw,vers=4.2\n")
    assert mount_type("/home/lab/study/scalectl.db", text) == "nfs4" and "nfs4" in NETWORK_TYPES
    assert mount_type("/home/labx/scalectl.db", text) == "ext4"


def test_reading_commands_take_the_journals_in(tmp_path):
    """`scalectl runs` (every command opens the store through one function) shows what a job
    journaled since the last command: its points and its status."""
    db, run_id, run_dir = _run(tmp_path, "journaled")
    out = JobStore(read_job_file(run_dir), run_dir, env={"SCALECTL_STORE_MODE": "journal"})
    out.update_run(status="running", started="2026-12-01T10:00:00+00:00")
    for step in (0, 5, 10):
        out.sink(_point(step))
    rows = json.loads(run_cli("runs", "--json", db=db, check=True).stdout)
    assert [(r["name"], r["status"], r["n_points"], r["last_step"], r["last_pass_rate"]) for r in rows] == [
        ("journaled", "running", 3, 10, 0.1)]


@pytest.mark.slow
def test_a_simulated_run_in_journal_mode_lands_through_the_command(tmp_path):
    """`scalectl run` of a simulated recipe with journals forced: the job journals its points and
    status, and the command's own reading of the store takes them in."""
    db = tmp_path / "s.db"
    proc = run_cli("run", "recipes/grpo.toml", "--setup", "setups/simulated.toml", "--json", "--name", "sim",
                   "--runs-dir", str(tmp_path / "runs"), "--set", "budget.steps=30", db=db,
                   env={"SCALECTL_STORE_MODE": "journal"})
    assert proc.returncode == 0, proc.stderr
    assert "store: journal mode" in proc.stderr and "SCALECTL_STORE_MODE=journal" in proc.stderr
    assert len(journal_files(tmp_path / "runs" / "sim")) == 1
    rows = json.loads(run_cli("runs", "--json", db=db, check=True).stdout)
    assert [(r["name"], r["status"], r["n_points"], r["last_step"]) for r in rows] == [("sim", "completed", 4, 30)]
