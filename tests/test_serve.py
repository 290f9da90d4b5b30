"""`scalectl serve`: the store in Datasette, with canned queries that return what the store holds."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from conftest import SCALECTL
from scalectl.store.database import Store

pytest.importorskip("datasette")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fill(db) -> dict:
    """Two runs of ablation 'abl' and one plain run, with points and one fit."""
    with Store.open(db) as store:
        ids = {}
        for name, status in (("abl--base--s0", "completed"), ("abl--loo-fp32--s0", "running"), ("solo", "failed")):
            ids[name] = store.create_run(name, recipe={"loss": {"type": "cispo"}, "async": {"mode": "sync"}},
                                         recipe_hash=name[:12].ljust(12, "0"), seed=0, status=status)
        for step, rate in ((0, 0.25), (10, 0.375), (20, 0.5)):
            store.add_point(ids["abl--base--s0"], {"step": step, "gpu_hours": step / 100, "flops": step * 1e9,
                                                   "tokens": step * 100, "samples": step * 8, "pass_rate": rate,
                                                   "truncation_rate": 0.0625, "mean_length": 12.5})
        store.add_point(ids["abl--loo-fp32--s0"], {"step": 0, "gpu_hours": 0.0, "flops": 0.0, "tokens": 0,
                                                   "samples": 0, "pass_rate": 0.125, "truncation_rate": 0.5,
                                                   "mean_length": 20.0})
        store.save_fit(ids["abl--base--s0"], "gpu_hours/test", {"A": 0.61, "B": 1.97, "C_mid": 0.05, "R0": 0.2,
                                                                 "axis": "gpu_hours", "n_points": 3, "rmse": 0.01,
                                                                 "intervals": {"A": [0.59, 0.63]}}, "digest")
    return ids


@pytest.fixture
def server(tmp_path):
    db = tmp_path / "exp.db"            # not scalectl.db: the queries follow the file's name
    ids = _fill(db)
    port = _free_port()
    proc = subprocess.Popen([SCALECTL, "serve", "--db", str(db), "--port", str(port)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}/exp"
    deadline = time.time() + 120
    while True:                          # wait until it answers (or has died)
        assert proc.poll() is None, proc.stdout.read()
        try:
            urllib.request.urlopen(base + ".json", timeout=5)
            break
        except OSError:
            assert time.time() < deadline, "datasette did not answer within 120 s"
            time.sleep(0.2)
    yield base, ids, db
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) is not None


def _query(base: str, query: str, **params) -> list[dict]:
    qs = "&".join(f"{k}={v}" for k, v in params.items())
    with urllib.request.urlopen(f"{base}/{query}.json?_shape=objects&{qs}", timeout=30) as resp:
        return json.loads(resp.read())["rows"]


def test_canned_queries_return_the_stores_runs_points_fits_and_ablations(server):
    base, ids, db = server
    runs = _query(base, "runs", status="", name="")
    assert [(r["name"], r["status"], r["points"], r["last_step"]) for r in runs] == [
        ("solo", "failed", 0, None), ("abl--loo-fp32--s0", "running", 1, 0), ("abl--base--s0", "completed", 3, 20)]
    assert runs[-1]["last_pass_rate"] == 0.5 and runs[-1]["loss"] == "cispo"
    assert [r["name"] for r in _query(base, "runs", status="completed", name="")] == ["abl--base--s0"]
    points = _query(base, "points", run="abl--base--s0")
    assert [(p["step"], p["pass_rate"], p["gpu_hours"]) for p in points] == [(0, 0.25, 0.0), (10, 0.375, 0.1),
                                                                              (20, 0.5, 0.2)]
    assert _query(base, "points", run=str(ids["abl--base--s0"])) == points         # by id too
    (fit,) = _query(base, "fits", name="")
    assert (fit["run"], fit["A"], fit["A_low"], fit["A_high"], fit["B"]) == ("abl--base--s0", 0.61, 0.59, 0.63, 1.97)
    (abl,) = _query(base, "ablations")
    assert (abl["ablation"], abl["runs"], abl["completed"], abl["active"]) == ("abl", 2, 1, 1)
    rows = _query(base, "ablation_runs", ablation="abl")
    assert [(r["variant"], r["status"], r["last_pass_rate"], r["fitted_A"]) for r in rows] == [
        ("base", "completed", 0.5, 0.61), ("loo-fp32", "running", 0.125, None)]


def test_the_page_claims_no_license_for_the_users_data(server):
    """The store holds the user's own results: the page names no data license (it said
    'Data license: Apache-2.0', the license of scalectl's code, over a private store)."""
    from scalectl.commands.serve import metadata_for

    base, _, db = server
    for url in (base.rsplit("/", 1)[0] + "/", base):         # the instance's page and the store's
        with urllib.request.urlopen(url, timeout=30) as resp:
            page = resp.read().decode()
        assert "Runs" in page or "scalectl store" in page
        assert "license" not in page.lower()
    assert "license" not in metadata_for(db) and "license_url" not in metadata_for(db)


def test_serve_only_reads(server):
    base, ids, db = server
    size = db.stat().st_size
    _query(base, "runs", status="", name="")
    req = urllib.request.Request(f"{base}/-/query", data=b"sql=delete+from+runs", method="POST")
    with pytest.raises(OSError):         # no write API: the request is refused
        urllib.request.urlopen(req, timeout=30)
    with Store.open(db) as store:
        assert len(store.list_runs()) == 3
    assert db.stat().st_size == size


def test_serve_without_a_store_says_so(tmp_path):
    proc = subprocess.run([SCALECTL, "serve", "--db", str(tmp_path / "none.db")], capture_output=True, text=True,
                          cwd=tmp_path, env=dict(os.environ, COLUMNS="200"))
    assert proc.returncode == 2 and "none.db: no store there" in proc.stderr
