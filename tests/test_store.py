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
    ("compute,pass_rat,colour\n0,0.3,red\n", "no pass_rate column (columns: compute, pass_rat, colour)"),
    ("compute,pass_rate\n0,\n10,\n", "no row has a pass rate (2 row(s), pass_rate from column 'pass_rate')"),
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


# --------------------------------------------------------------------------- curves from other trainers

#: The curve every imported run below follows: A = 0.6, B = 1.5, C_mid = 50 GPU-hours, R0 = 0.1.
def _sigmoid(c: float) -> float:
    return 0.1 + 0.5 / (1 + (50 / c) ** 1.5)


def _import(runner, *args: str) -> dict:
    from scalectl.cli import app

    result = runner.invoke(app, ["import", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _fit(runner, db: Path, *runs: str) -> tuple[dict, str]:
    from scalectl.cli import app

    result = runner.invoke(app, ["fit", *runs, "--bootstrap", "0", "--json", "--db", str(db)])
    assert result.exit_code == 0, result.output
    return {f["run"]: f["fit"] for f in json.loads(result.stdout)["fits"]}, result.stderr


@pytest.fixture
def runner():
    from typer.testing import CliRunner

    return CliRunner()


def test_tensorboard_folder_imports_and_fits(tmp_path, db_path, runner):
    """A run folder written with torch's SummaryWriter: eval/pass_rate and eval/gpu_hours every
    second step, train/loss every step; the points are the pass-rate steps, the fit recovers A."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    for step in range(1, 81):
        writer.add_scalar("train/loss", 1.0 / step, step)
        if step % 2 == 0:
            writer.add_scalar("eval/pass_rate", _sigmoid(step * 2.5), step)
            writer.add_scalar("eval/gpu_hours", step * 2.5, step)
    writer.close()
    done = _import(runner, str(tmp_path / "tb"), "--name", "tb", "--db", str(db_path))
    assert done["points"] == 40
    assert done["notes"] == [
        "left out 1 column(s) that are not fields of a point: train/loss (--map COLUMN=FIELD reads one)",
        "left out 40 of 80 rows without a pass rate (logged between evaluations)",
        "compute: gpu_hours from column 'eval/gpu_hours'"]
    with Store.open(db_path) as store:
        points = store.points(store.get_run("tb")["id"])
    assert [p["step"] for p in points] == list(range(2, 81, 2))
    assert [p["gpu_hours"] for p in points] == [s * 2.5 for s in range(2, 81, 2)]    # exact in float32
    # TensorBoard keeps float32: each pass rate within half an ulp of 0.6 (3e-8)
    assert all(abs(p["pass_rate"] - _sigmoid(p["gpu_hours"])) < 3e-8 for p in points)
    assert all(p["wall_seconds"] >= 0 for p in points)
    fits, _ = _fit(runner, db_path, "tb")
    assert fits["tb"]["axis"] == "gpu_hours"
    assert fits["tb"]["A"] == pytest.approx(0.6, abs=1e-4) and fits["tb"]["B"] == pytest.approx(1.5, abs=1e-2)


def _store_files(db: Path) -> dict[str, bytes]:
    """The bytes of the store and the files beside it (its -wal and -shm)."""
    return {p.name: p.read_bytes() for p in sorted(db.parent.iterdir()) if p.name.startswith(db.name)}


def _store_with_a_run(tmp_path: Path, db: Path, runner) -> dict[str, bytes]:
    """``db`` holding run ``keep`` (closed), and its files' bytes."""
    (tmp_path / "keep.csv").write_text("step,pass_rate\n0,0.2\n1,0.3\n")
    _import(runner, str(tmp_path / "keep.csv"), "--name", "keep", "--db", str(db))
    return _store_files(db)


def _refused(runner, db: Path, *args: str) -> str:
    """stderr of an import that must be refused (exit 2, no traceback)."""
    from scalectl.cli import app

    result = runner.invoke(app, ["import", *args, "--db", str(db)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (result.output, result.exception)
    return " ".join(result.stderr.split())


def test_tensorboard_step_logged_twice_with_different_values_is_refused(tmp_path, db_path, runner):
    """A run restarted in its own folder logs steps 4 and 6 again (a second event file, written by
    SummaryWriter as a resumed run writes it): a column read holding two values at one step is
    refused naming the step, the tag and both values, as the CSV reader refuses a step given
    twice, and nothing is stored; repeating the same value, or two values of a column left out,
    imports."""
    from torch.utils.tensorboard import SummaryWriter

    before = _store_with_a_run(tmp_path, db_path, runner)
    first = SummaryWriter(str(tmp_path / "tb"))
    for step in (2, 4, 6):
        first.add_scalar("eval/pass_rate", step / 10, step)
        first.add_scalar("train/loss", 1 / step, step)
    first.close()
    again = SummaryWriter(str(tmp_path / "tb"), filename_suffix=".resumed")
    for step in (4, 6):
        again.add_scalar("eval/pass_rate", 0.25 if step == 4 else 0.6, step)   # step 6 as before
        again.add_scalar("train/loss", 2 / step, step)
    again.close()
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2
    said = _refused(runner, db_path, str(tmp_path / "tb"), "--name", "tb")
    assert f"error: {tmp_path / 'tb'}: step 4: 'eval/pass_rate' appears more than once at this step, with " \
           "different values (0.4000000059604645, then 0.25): a point holds one value per step" in said, said
    assert _store_files(db_path) == before
    mapped = _refused(runner, db_path, str(tmp_path / "tb"), "--name", "tb", "--map", "train/loss=train_reward")
    assert "step 4: 'eval/pass_rate' appears more than once" in mapped          # the first in step order
    # step 4 given once more, at the value it had: the repeats hold one value each but train/loss's
    fixed = SummaryWriter(str(tmp_path / "tb"), filename_suffix=".fixed")
    fixed.add_scalar("eval/pass_rate", 0.4, 4)
    fixed.close()
    (next((tmp_path / "tb").glob("*.resumed"))).unlink()
    done = _import(runner, str(tmp_path / "tb"), "--name", "tb", "--db", str(db_path))
    assert done["points"] == 3 and "train/loss" in done["notes"][0]
    with Store.open(db_path) as store:
        assert [p["pass_rate"] for p in store.points(store.get_run("tb")["id"])] == \
            pytest.approx([0.2, 0.4, 0.6], abs=3e-8)
    fixed = SummaryWriter(str(tmp_path / "tb"), filename_suffix=".loss")
    fixed.add_scalar("train/loss", 7.0, 2)
    fixed.close()
    assert _import(runner, str(tmp_path / "tb"), "--name", "tb-left-out", "--db", str(db_path))["points"] == 3
    said = _refused(runner, db_path, str(tmp_path / "tb"), "--name", "tb-loss", "--map", "train/loss=train_reward")
    assert "step 2: 'train/loss' appears more than once at this step, with different values (0.5, then 7.0)" in said


def test_mlflow_step_logged_twice_with_different_values_is_refused(tmp_path, db_path, runner, monkeypatch):
    """An MLflow run (a mlruns folder written by mlflow) whose metric holds two values at one step:
    refused as the CSV reader refuses a step given twice, nothing stored."""
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")     # MLflow 3 keeps the folder store behind this
    before = _store_with_a_run(tmp_path, db_path, runner)
    client = mlflow.tracking.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = client.create_run(client.create_experiment("study"), run_name="twice")
    for step, rate in ((2, 0.3), (4, 0.5), (4, 0.45), (6, 0.6)):
        client.log_metric(run.info.run_id, "eval/pass_rate", rate, step=step)
    said = _refused(runner, db_path, str(tmp_path / "mlruns"), "--name", "ml")
    assert f"MLflow run twice ({run.info.run_id}) of {tmp_path / 'mlruns'}: step 4: 'eval/pass_rate' appears more " \
           "than once at this step, with different values (0.5, then 0.45): a point holds one value per step" in said
    assert _store_files(db_path) == before


def test_wandb_export_with_sparse_rows_imports_on_runtime_x_devices(tmp_path, db_path, runner):
    """W&B's CSV export of a run: _step, _runtime, _timestamp, a key per column, and rows of
    training steps without the evaluation's keys.  GPU-hours = runtime x 8 devices."""
    lines = ["_step,_runtime,_timestamp,train/loss,eval/pass_rate"]
    for step in range(1, 81):
        rate = f"{_sigmoid(step * 2.5):.9f}" if step % 2 == 0 else ""
        lines.append(f"{step},{step * 2.5 * 3600 / 8},{1_700_000_000 + step * 1125},{1 / step:.4f},{rate}")
    (tmp_path / "wandb.csv").write_text("\n".join(lines) + "\n")
    done = _import(runner, str(tmp_path / "wandb.csv"), "--name", "wb", "--devices", "8", "--db", str(db_path))
    assert done["points"] == 40
    assert done["notes"] == [
        "left out 2 column(s) that are not fields of a point: _timestamp, train/loss (--map COLUMN=FIELD reads one)",
        "left out 40 of 80 rows without a pass rate (logged between evaluations)",
        "compute: gpu_hours = _runtime (seconds) / 3600 x 8 device(s) (--devices)"]
    with Store.open(db_path) as store:
        points = store.points(store.get_run("wb")["id"])
    # runtime s x 8 / 3600 = step x 2.5 GPU-hours: exact up to float rounding (1e-12 relative)
    assert [p["gpu_hours"] for p in points] == pytest.approx([s * 2.5 for s in range(2, 81, 2)], rel=1e-12)
    assert [p["wall_seconds"] for p in points] == [s * 2.5 * 3600 / 8 for s in range(2, 81, 2)]
    fits, _ = _fit(runner, db_path, "wb")
    assert fits["wb"]["A"] == pytest.approx(0.6, abs=1e-4) and fits["wb"]["C_mid"] == pytest.approx(50, rel=1e-3)
    # the same file on step x cost, and a column read by --map
    done = _import(runner, str(tmp_path / "wandb.csv"), "--name", "wb-steps", "--hours-per-step", "2.5",
                   "--db", str(db_path))
    assert done["notes"][-1] == "compute: gpu_hours = step x 2.5 GPU-hours per step (--hours-per-step)"
    mapped = _import(runner, str(tmp_path / "wandb.csv"), "--name", "wb-loss", "--map", "train/loss=train_reward",
                     "--db", str(db_path))
    assert mapped["notes"][0] == ("left out 1 column(s) that are not fields of a point: _timestamp "
                                  "(--map COLUMN=FIELD reads one)")
    with Store.open(db_path) as store:
        first = store.points(store.get_run("wb-loss")["id"])[0]
    assert (first["step"], first["train_reward"], first["gpu_hours"]) == (2, 0.5, None)


@pytest.mark.slow     # MLflow creates its SQLite schema by ~30 migrations: 7 s of CPU, 25 s on a busy machine
def test_mlflow_store_imports_by_run_name(tmp_path, db_path, runner):
    """An MLflow SQLite tracking store written by mlflow itself, holding two runs: each imported
    by name; the store's runs are listed when the name is wrong."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("study")
    for name, scale in (("baseline", 2.5), ("other", 5.0)):
        run = client.create_run(experiment, run_name=name)
        for step in range(2, 81, 2):
            client.log_metric(run.info.run_id, "eval/pass_rate", _sigmoid(step * scale), step=step)
            client.log_metric(run.info.run_id, "eval/gpu_hours", step * scale, step=step)
            client.log_metric(run.info.run_id, "train/loss", 1 / step, step=step)
        client.set_terminated(run.info.run_id)
    done = _import(runner, uri, "--run", "baseline", "--name", "ml", "--db", str(db_path))
    assert done["points"] == 40 and done["notes"][-1] == "compute: gpu_hours from column 'eval/gpu_hours'"
    from scalectl.cli import app

    wrong = runner.invoke(app, ["import", uri, "--run", "nope", "--name", "x", "--db", str(db_path)])
    assert wrong.exit_code == 2 and "no MLflow run 'nope'; name one with --run ID-OR-NAME" in wrong.stderr
    assert "baseline (" in wrong.stderr and "other (" in wrong.stderr
    fits, _ = _fit(runner, db_path, "ml")
    assert fits["ml"]["A"] == pytest.approx(0.6, abs=1e-4) and fits["ml"]["C_mid"] == pytest.approx(50, rel=1e-3)


def test_runs_on_different_axes_are_each_fitted_on_what_they_have(tmp_path, db_path, runner):
    """One run with GPU-hours, one with steps alone: `fit` and `compare` fit each on its own
    axis and say so, instead of refusing both."""
    from scalectl.cli import app

    (tmp_path / "hours.csv").write_text("gpu_hours,pass_rate\n" + "".join(
        f"{c},{_sigmoid(c):.9f}\n" for c in range(5, 200, 5)))
    (tmp_path / "steps.csv").write_text("_step,eval/pass_rate\n" + "".join(
        f"{s},{_sigmoid(s * 2):.9f}\n" for s in range(5, 200, 5)))
    _import(runner, str(tmp_path / "hours.csv"), "--name", "hours", "--db", str(db_path))
    done = _import(runner, str(tmp_path / "steps.csv"), "--name", "steps", "--db", str(db_path))
    assert done["notes"] == ["compute: no GPU-hours (no column; --hours-per-step or --devices would give them): "
                             "the points keep step"]
    fits, said = _fit(runner, db_path, "hours", "steps")
    assert (fits["hours"]["axis"], fits["steps"]["axis"]) == ("gpu_hours", "step")
    assert fits["steps"]["C_mid"] == pytest.approx(25, rel=1e-3)        # 50 GPU-hours at 2 GPU-hours per step
    assert "note: run steps has no gpu_hours values (its default axis); fitted on step, the axis it has" in said
    compared = runner.invoke(app, ["compare", "hours", "steps", "--bootstrap", "50", "--json", "--db", str(db_path)])
    assert compared.exit_code == 0, compared.output
    data = json.loads(compared.stdout)
    assert [f["code"] for f in data["flags"]] == ["mixed_axis"]
    row = next(r for r in data["rows"] if r["name"] == "steps")
    assert row["verdict"] == "tie on ceiling, speed undecided" and row["speed_ratio"] is None
    assert "speed not compared: steps is fitted on step, hours on gpu_hours" in row["reason"]


# --------------------------------------------------------------------------- evaluation series, removing runs


def _store_at_version_3(path: Path) -> None:
    """A store as scalectl wrote it before evaluation series (schema version 3), one run with two points."""
    import sqlite_utils

    from scalectl.store.database import MIGRATIONS

    conn = sqlite3.connect(path)
    for migrate in MIGRATIONS[:3]:
        migrate(sqlite_utils.Database(conn))
    conn.execute("PRAGMA user_version = 3")
    conn.execute("INSERT INTO runs (name, status) VALUES ('old', 'completed')")
    conn.execute("INSERT INTO eval_points (run_id, step, pass_rate, gpu_hours) VALUES (1, 0, 0.25, 0.0), "
                 "(1, 10, 0.5, 1.5)")
    conn.commit()
    conn.close()


def test_a_version_3_store_gains_the_series_table_and_keeps_its_points(tmp_path):
    path = tmp_path / "old.db"
    _store_at_version_3(path)
    with Store.open(path) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        run = store.get_run("old")["id"]
        assert store.get_run("old")["warm_start"] is None          # schema 6: the column, empty for old runs
        assert [(p["step"], p["pass_rate"]) for p in store.points(run)] == [(0, 0.25), (10, 0.5)]
        assert store.series(run) == [] and store.points(run, "aime24") == []
        store.add_series_points(run, "aime24", "tests/data/math/aime24.parquet", 30,
                                [{"step": 10, "pass_rate": 0.1, "samples_per_prompt": 4, "correct_counts": [3] * 4
                                  + [0] * 26, "gpu_hours": 1.5}])
        assert store.points(run) == store.points(run)              # the validation points are untouched
        (point,) = store.points(run, "aime24")
        assert (point["step"], point["pass_rate"], point["source"], point["prompts"]) == \
            (10, 0.1, "tests/data/math/aime24.parquet", 30)
        assert point["correct_counts"] == [3] * 4 + [0] * 26
        assert store.series(run) == [{"series": "aime24", "source": "tests/data/math/aime24.parquet", "prompts": 30,
                                      "samples_per_prompt": 4, "points": 1, "first_step": 10, "last_step": 10}]
        before = store.points_digest(run, "aime24")
        store.add_series_points(run, "aime24", "tests/data/math/aime24.parquet", 30,
                                [{"step": 10, "pass_rate": 0.2}])                  # replaces, never duplicates
        assert [p["pass_rate"] for p in store.points(run, "aime24")] == [0.2]
        assert store.points_digest(run, "aime24") != before
        assert store.points_digest(run) == store.points_digest(run)
        with pytest.raises(ValueError, match="needs a name"):
            store.add_series_points(run, "", "x", 1, [{"step": 0, "pass_rate": 0.0}])


def test_a_read_only_version_3_store_is_read_as_it_is(tmp_path):
    path = tmp_path / "old.db"
    _store_at_version_3(path)
    root = os.geteuid() == 0                        # root ignores file modes: the immutable attribute binds it
    if root and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root where chattr +i is not available")
    if not root:
        path.chmod(0o444)
    try:
        with Store.open(path, create=False) as store:
            assert store.readonly
            run = store.get_run("old")["id"]
            assert [p["step"] for p in store.points(run)] == [0, 10]
            assert store.series(run) == [] and store.points(run, "x") == []
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True) if root else path.chmod(0o644)


def test_delete_run_removes_its_rows_only(db_path):
    with Store.open(db_path) as store:
        gone, kept = store.create_run("gone"), store.create_run("kept")
        for run in (gone, kept):
            store.add_points(run, [{"step": s, "pass_rate": 0.1 * s, "gpu_hours": s} for s in range(4)])
            store.add_series_points(run, "aime", "a.parquet", 30, [{"step": 3, "pass_rate": 0.0}])
            store.save_fit(run, "k", {"A": 0.5}, "d")
        assert store.delete_run(gone) == {"eval_points": 4, "series_points": 1, "fits": 1, "journal_offsets": 0,
                                          "runs": 1}
        assert [r["name"] for r in store.list_runs()] == ["kept"]
        assert len(store.points(kept)) == 4 and len(store.points(kept, "aime")) == 1
        assert store.get_fit(kept, "k") is not None
        with pytest.raises(UserError, match="no run"):
            store.delete_run(gone)
        store.create_run("gone")                                  # the name is free again


def test_a_version_4_store_gains_checker_errors_and_keeps_its_points(tmp_path):
    import sqlite_utils

    from scalectl.store.database import MIGRATIONS

    path = tmp_path / "v4.db"
    conn = sqlite3.connect(path)
    db = sqlite_utils.Database(conn)
    for migrate in MIGRATIONS[:4]:
        migrate(db)
    for table in ("eval_points", "series_points"):      # as version 4 made them: without the column
        if "checker_errors" in db[table].columns_dict:
            db[table].transform(drop={"checker_errors"})
    conn.execute("PRAGMA user_version = 4")
    conn.execute("INSERT INTO runs (name, status) VALUES ('old', 'completed')")
    conn.execute("INSERT INTO eval_points (run_id, step, pass_rate) VALUES (1, 0, 0.25)")
    conn.commit()
    conn.close()
    with Store.open(path) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        run = store.get_run("old")["id"]
        (old,) = store.points(run)
        assert (old["step"], old["pass_rate"], old["checker_errors"]) == (0, 0.25, None)
        store.add_point(run, {"step": 10, "pass_rate": 0.5, "checker_errors": 3})
        assert [(p["step"], p["checker_errors"]) for p in store.points(run)] == [(0, None), (10, 3)]
