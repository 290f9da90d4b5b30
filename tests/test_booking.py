"""What the dry run books (scalectl.job.booking, scalectl.launch.slurm.booking_lines): the rate
per step, the steps the budget buys, the wall-clock, the Slurm jobs it takes, the checkpoint
disk and the warnings; and the submitit rule that decides how many jobs a run gets."""

from __future__ import annotations

import json
import math
import types
from datetime import datetime, timedelta, timezone

import pytest

from conftest import ROOT, run_cli
from scalectl.job.booking import ESTIMATE_UTILISATION, book, estimated_rate, measured_rate, reserve
from scalectl.launch.slurm import MAX_TIMEOUTS, booking_lines, reservation, time_limit_jobs
from scalectl.recipe.load import load

PAPER = (ROOT / "recipes/scalerl.toml", ROOT / "setups/paper-8b.toml")


def test_submitit_requeues_a_run_after_three_time_limits_and_ends_it_at_the_fourth(tmp_path):
    """submitit's own SignalHandler, driven as Slurm drives it (SIGUSR2 before each time limit),
    on the job the launcher submits: requeued with a count of 2, 1 and 0 left, then 'timed-out
    too many times' (the job body marks the run timed_out): at most MAX_TIMEOUTS + 1 = 4 jobs."""
    from submitit.core import job_environment, utils
    from submitit.core.utils import DelayedSubmission

    from scalectl.launch.slurm import SlurmRunJob

    delayed = DelayedSubmission(SlurmRunJob(), str(tmp_path / "run"))
    delayed.set_timeout(60, MAX_TIMEOUTS)              # as SlurmExecutor(max_num_timeout=MAX_TIMEOUTS) does
    requeued = []
    env = types.SimpleNamespace(global_rank=0, _requeue=requeued.append)
    paths = types.SimpleNamespace(submitted_pickle=tmp_path / "submitted.pkl")
    jobs, ended = 0, None
    while ended is None and jobs < 10:
        jobs += 1
        handler = job_environment.SignalHandler(env, paths, delayed)
        handler.has_timed_out = lambda: True
        handler._exit = lambda: None
        try:
            handler.checkpoint_and_try_requeue(12)
        except utils.UncompletedJobError as exc:
            ended = str(exc)
        delayed = DelayedSubmission.load(paths.submitted_pickle)
    assert requeued == [2, 1, 0] and jobs == MAX_TIMEOUTS + 1 == 4
    assert "timed-out too many times" in ended


def test_jobs_a_wall_clock_takes_with_the_steps_each_requeue_trains_again():
    h = 3600.0
    assert time_limit_jobs(200 * h, 72 * h, 0.0) == 3                # 200 / 72 = 2.8
    # each requeue trains up to 100 steps again (5.7 h): 3 jobs hold 216 - 2 x 5.7 = 204.6 h < 211 h
    assert time_limit_jobs(211 * h, 72 * h, 5.7 * h) == 4
    assert time_limit_jobs(204 * h, 72 * h, 5.7 * h) == 3
    assert time_limit_jobs(10 * h, 72 * h, 5.7 * h) == 1
    assert time_limit_jobs(100 * h, 5 * h, 6 * h) is None             # a job no longer than the redo


def test_the_paper_budget_at_the_estimated_rate():
    """8B parameters, 48 x 16 completions of at most 2,048 + 14,336 tokens: 8 x 8e9 x 768 x 16,384
    FLOPs a step, at 5 % of 80 H100s' 989 TFLOP/s; the 16,000 GPU-hours buy floor(16000 / (80 x
    seconds / 3600)) steps; a checkpoint is 8e9 x (2 + 12) bytes, three of them on disk at once."""
    recipe = load(*PAPER, [])
    rate = estimated_rate(recipe, 8_000_000_000)
    flops = 8 * 8e9 * 768 * 16_384
    seconds = flops / (80 * 989e12 * ESTIMATE_UTILISATION)
    assert rate.seconds_per_step == pytest.approx(seconds) and not rate.measured
    assert rate.gpu_hours_per_step == pytest.approx(80 * seconds / 3600)
    assert rate.eval_seconds == pytest.approx(2 * 8e9 * 1000 * 16 * 16_384 / (80 * 989e12 * ESTIMATE_UTILISATION))
    b = book(recipe, 8_000_000_000, rate)
    steps = math.floor(16_000 / (80 * seconds / 3600))
    assert b.steps == steps and b.evaluations == len(range(100, steps + 1, 100)) + 2   # step 0 and the last
    assert b.wall_seconds == pytest.approx(steps * seconds + b.evaluations * rate.eval_seconds)
    assert b.checkpoint_bytes == 8e9 * 14 and b.disk_bytes == 3 * 8e9 * 14
    assert b.redo_seconds == pytest.approx(100 * seconds)
    lines = booking_lines(recipe, b.wall_seconds, b.redo_seconds)
    jobs = time_limit_jobs(b.wall_seconds, 4320 * 60, b.redo_seconds)
    assert jobs <= MAX_TIMEOUTS + 1
    assert lines[0].startswith("time limit: launcher.slurm.time_min = 4320 (72 h) per job") and \
        f"need {jobs} jobs, the first and {jobs - 1} requeue(s)" in lines[0] and "within the rule" in lines[0]
    assert [line.split(" (")[0] for line in lines[1:]] == ["warning: the sbatch script has no --partition",
                                                          "warning: the sbatch script has no --account"]
    short = load(*PAPER, ["launcher.slurm.time_min=1440", "launcher.slurm.partition=gpu",
                          "launcher.slurm.account=lab"])
    lines = booking_lines(short, b.wall_seconds, b.redo_seconds)
    assert len(lines) == 1 and lines[0].startswith("warning: time limit") and "more than the rule allows" in lines[0]


def test_what_to_book_holds_every_gpu_for_the_steps_the_evaluations_and_the_requeues():
    """The bottom line's numbers: 80 GPUs (10 nodes x 8) held for the steps, the 37 evaluations
    and 3 requeues that each train up to 100 steps again; each part rounded to 0.1 h, the wall-clock
    their sum and the GPU-hours 80 x that wall-clock, within rounding of the unrounded arithmetic."""
    recipe = load(*PAPER, [])
    seconds = 8 * 8e9 * 768 * 16_384 / (80 * 989e12 * ESTIMATE_UTILISATION)
    eval_seconds = 2 * 8e9 * 1000 * 16 * 16_384 / (80 * 989e12 * ESTIMATE_UTILISATION)
    steps = math.floor(16_000 / (80 * seconds / 3600))
    evals = len(range(100, steps + 1, 100)) + 2
    b = book(recipe, 8_000_000_000, estimated_rate(recipe, 8_000_000_000))
    res = reservation(recipe, b)
    assert (res.devices, res.jobs, res.job_hours) == (80, 4, 72.0) and not res.measured
    assert res.step_hours == round(steps * seconds / 3600, 1) == 199.9
    assert res.eval_hours == round(evals * eval_seconds / 3600, 1) == 10.9
    assert res.redo_hours == round(100 * seconds / 3600, 1) == 5.7
    assert res.wall_hours == pytest.approx(199.9 + 10.9 + 3 * 5.7) and res.device_hours == pytest.approx(80 * 227.9)
    exact = 80 * (steps * seconds + evals * eval_seconds + 3 * 100 * seconds) / 3600
    assert abs(res.device_hours - exact) <= 80 * 0.25
    # 4 jobs of 72 h hold the wall-clock with its requeues; 3 do not
    assert 3 * 72 < res.wall_hours <= 4 * 72
    # more than the devices' step GPU-hours the budget counts: evaluations and requeues come on top
    assert res.device_hours > 16_000 + 80 * (10.9 + 17.1) - 80
    # without a time limit (local): one job, nothing trained again
    local = reserve(b, 80)
    assert (local.jobs, local.redo_hours, local.wall_hours) == (1, 0.0, pytest.approx(199.9 + 10.9))
    with pytest.raises(ValueError, match="jobs = 0 and devices = 80 must be >= 1"):
        reserve(b, 80, jobs=0)


def _stamp(seconds: float) -> str:
    return (datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=seconds)).isoformat(timespec="seconds")


def test_a_stored_run_of_the_recipe_on_the_hardware_gives_the_measured_rate(tmp_path):
    """A run of the same recipe shape on H100-80GB stored a point every 100 steps, 6 h apart,
    at 4 GPU-hours a step: 216 s a step (evaluations included), 16,000 / 4 = 4,000 steps; the
    dry run says so, names the run, and no evaluation time is added on top."""
    from scalectl.store.database import Store

    recipe = load(*PAPER, [])
    db = tmp_path / "s.db"
    with Store.open(db) as store:
        rid = store.create_run("paper-s0", recipe=recipe.to_dict(), hardware="H100-80GB", status="completed")
        store.add_points(rid, [{"step": s, "pass_rate": 0.3, "gpu_hours": 4.0 * s, "time": _stamp(216.0 * s)}
                               for s in range(0, 501, 100)])
        other = store.create_run("other-s0", recipe=load(*PAPER, ["batch.prompts_per_step=64"]).to_dict())
        store.add_points(other, [{"step": s, "pass_rate": 0.3, "gpu_hours": 1.0 * s, "time": _stamp(s)}
                                 for s in (0, 100)])
        stored = [(r, store.points(r["id"])) for r in store.list_runs()]
    rate = measured_rate(recipe, stored, str(db))
    assert rate.measured and rate.seconds_per_step == pytest.approx(216.0) and rate.gpu_hours_per_step == 4.0
    assert rate.eval_seconds is None and "(paper-s0)" in rate.source
    b = book(recipe, 8_000_000_000, rate)
    assert b.steps == 4000 and b.wall_seconds == pytest.approx(4000 * 216.0)
    proc = run_cli("run", str(PAPER[0]), "--setup", str(PAPER[1]), "--dry-run", db=db, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "rate: 216 s and 4 GPU-hours per step, measured on 1 stored run(s) of this recipe on H100-80GB" in proc.stderr
    assert ("budget: budget.gpu_hours = 16000 buys 4,000 steps, 16,000 GPU-hours of generation and training "
            "(the run's compute axis;") in proc.stderr and ", 41 evaluations" in proc.stderr
    assert "wall-clock: about 240 h\n" in proc.stderr
    # 4,000 x 216 s = 240 h; 72-h jobs, each requeue training 100 x 216 s = 6 h again: 4 jobs (3 hold 204 h)
    assert time_limit_jobs(240 * 3600.0, 72 * 3600.0, 6 * 3600.0) == 4
    assert ("to book: 20,640 GPU-hours = 80 GPUs x 258.0 h wall-clock (240.0 h of steps + 18.0 h trained again "
            "after 3 requeue(s), up to 6.0 h each), 4 job(s) of at most 72.0 h; at the rate measured on stored runs "
            "(evaluations and checkpoints in its wall-clock)") in proc.stderr
    assert "estimated" not in proc.stderr.split("to book: ")[1]


def test_the_paper_dry_run_books_a_cluster(tmp_path):
    """`scalectl run scalerl --setup paper-8b --dry-run` from a folder without the cluster's
    files: wall-clock, steps, jobs under the time limit, checkpoint disk, the sbatch options
    missing, and the model and data paths that do not exist here, named; no store is made."""
    proc = run_cli("run", "scalerl", "--setup", "paper-8b", "--dry-run", db=tmp_path / "s.db", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    recipe = load(*PAPER, [])
    b = book(recipe, 8_000_000_000, estimated_rate(recipe, 8_000_000_000))
    assert f"budget: budget.gpu_hours = 16000 buys {b.steps:,} steps" in err
    assert "wall-clock: about 211 h = 200 h of steps + 37 evaluations x 18 min" in err
    assert "time limit: launcher.slurm.time_min = 4320 (72 h) per job: about 211 h need 4 jobs" in err
    # the bottom line, last of the booking: 80 x (199.9 + 10.9 + 3 x 5.7) = 80 x 227.9 = 18,232
    assert 80 * 227.9 == pytest.approx(18_232) and 199.9 + 10.9 + 3 * 5.7 == pytest.approx(227.9)
    bottom = next(ln for ln in err.splitlines() if ln.startswith("to book: "))
    assert bottom.startswith("to book: 18,232 GPU-hours = 80 GPUs x 227.9 h wall-clock (199.9 h of steps + 10.9 h "
                             "of evaluations + 17.1 h trained again after 3 requeue(s), up to 5.7 h each), 4 job(s) "
                             "of at most 72.0 h; at an estimated rate, not a measured one (5% of the devices' peak")
    assert "checkpoint disk: 112.0 GB per checkpoint" in err and "336.0 GB in the run folder" in err
    assert "warning: the sbatch script has no --partition" in err and "no --account" in err
    assert (f"warning: model.path = 'checkpoints/8b-sft': no such folder on this machine (from {tmp_path}; "
            "`scalectl validate` refuses it)") in err
    assert "warning: data.source = 'data/polaris-53k.parquet': no such file on this machine" in err
    # each missing path warned about once
    assert err.count("'checkpoints/8b-sft': no such folder") == 1 and err.count("'data/polaris-53k.parquet': no such") == 1
    assert not (tmp_path / "s.db").exists()
    data = json.loads(run_cli("run", "scalerl", "--setup", "paper-8b", "--dry-run", "--json", db=tmp_path / "s.db",
                              cwd=tmp_path, check=True).stdout)
    assert data["booking"]["steps"] == b.steps and data["booking"]["disk_bytes"] == 336e9
    assert data["booking"]["reservation"]["device_hours"] == pytest.approx(18_232)
    assert data["booking"]["reservation"]["jobs"] == 4 and data["booking"]["reservation"]["measured"] is False
    assert sum(w.startswith("warning: model.path") for w in data["warnings"]) == 1


@pytest.mark.parametrize("hook", [True, False], ids=["exit-without-teardown", "plain"])
def test_a_task_that_succeeded_exits_after_submitit_wrote_its_result_without_the_teardown(tmp_path, hook):
    """submitit's own job entry (``python -m submitit.core._submit``) as a task of a 2-task Slurm
    job runs a job that registers an exit handler (standing for the interpreter's teardown, where a
    gloo group's destruction can abort the process) and then, as SlurmRunJob does after a run that
    returned, :func:`scalectl.launch.slurm.exit_without_teardown`: the task exits 0 with its result
    written, and the earlier handler never runs (without the hook it does)."""
    import os
    import pickle
    import subprocess
    import sys

    from submitit.core.utils import DelayedSubmission

    mark = tmp_path / "teardown-ran"
    code = f"import atexit, pathlib\natexit.register(lambda: pathlib.Path({str(mark)!r}).write_text('ran'))\n"
    if hook:
        code += "from scalectl.launch.slurm import exit_without_teardown\nexit_without_teardown()\n"
    DelayedSubmission(exec, code, {}).dump(tmp_path / "77_submitted.pkl")
    env = dict(os.environ, SUBMITIT_EXECUTOR="slurm", SLURM_JOB_ID="77", SLURM_PROCID="0", SLURM_NTASKS="2",
               SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_JOB_NODELIST="localhost", SLURM_JOB_NUM_NODES="1")
    proc = subprocess.run([sys.executable, "-m", "submitit.core._submit", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert pickle.loads((tmp_path / "77_0_result.pkl").read_bytes()) == ("success", None)
    assert "Exiting after successful completion" in proc.stderr + proc.stdout
    assert mark.exists() is not hook


def test_the_dry_run_forecasts_the_pass_rate_its_booking_buys_from_stored_runs_of_the_recipe(tmp_path):
    """Two completed seeds of the paper recipe (budgets of 8,000 and 6,000 GPU-hours: the budget is
    not part of "the same recipe") drawn from a known curve, and a run of another batch size drawn
    from a higher one: the dry run of a 16,000 GPU-hour booking forecasts from the two seeds only,
    and the true curve at 16,000 lies inside the printed band."""
    import numpy as np

    from scalectl.curve import sigmoid
    from scalectl.store.database import Store

    def curve(c):
        return sigmoid(c, 0.61, 1.9, 2500.0, 0.3)

    db = tmp_path / "s.db"
    with Store.open(db) as store:
        for seed, (budget, end) in enumerate(((8000, 8000.0), (6000, 6000.0))):
            recipe = load(*PAPER, [f"budget.gpu_hours={budget}", f"seed={seed}"])
            rid = store.create_run(f"paper-s{seed}", recipe=recipe.to_dict(), recipe_hash=recipe.content_hash,
                                   seed=seed, hardware="H100-80GB", status="completed")
            x = np.linspace(0.0, end, 41)
            y = curve(x) + np.random.default_rng(seed).normal(0, 0.004, x.size)
            store.add_points(rid, [{"step": 25 * i, "gpu_hours": float(c), "pass_rate": float(p)}
                                   for i, (c, p) in enumerate(zip(x, y))])
        other = load(*PAPER, ["batch.prompts_per_step=64"])
        rid = store.create_run("bigger-batch", recipe=other.to_dict(), recipe_hash=other.content_hash, seed=0,
                               hardware="H100-80GB", status="completed")
        store.add_points(rid, [{"step": 25 * i, "gpu_hours": 200.0 * i, "pass_rate": 0.3 + 0.01 * i}
                               for i in range(41)])
    proc = run_cli("run", str(PAPER[0]), "--setup", str(PAPER[1]), "--dry-run", db=db, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("forecast: "))
    recipe = load(*PAPER, [])
    booked = book(recipe, 8_000_000_000, estimated_rate(recipe, 8_000_000_000)).gpu_hours   # whole steps
    assert 15_900 < booked <= 16_000
    assert (f"at the booked {booked:,.0f} GPU-hours (2x the 8,000 reached), from 2 stored run(s) of this recipe "
            "(paper-s0, paper-s1;") in line
    lo, hi = (float(v) for v in line.split("band [")[1].split("]")[0].split(", "))
    assert lo < float(curve(booked)) < hi
    # without a stored run of the recipe there is no forecast line
    bare = run_cli("run", str(PAPER[0]), "--setup", str(PAPER[1]), "--dry-run", db=tmp_path / "none.db",
                   cwd=tmp_path)
    assert "forecast:" not in bare.stderr
