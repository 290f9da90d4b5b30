"""Runs on a real one-node Slurm cluster on localhost (scripts/slurm-local.sh).

The cluster is used if it is up; started (and stopped afterwards) if this
process is root; otherwise these tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from conftest import ROOT, SCALECTL, cancel_stale_test_jobs, run_cli

pytestmark = pytest.mark.slurm

SCRIPT = ROOT / "scripts" / "slurm-local.sh"
TINY = ["--set", "async.mode=sync", "--set", "batch.prompts_per_step=4", "--set", "batch.generations_per_prompt=4",
        "--set", "eval.every_steps=2", "--set", "eval.prompts=20", "--set", "eval.samples_per_prompt=2",
        "--set", "checkpoint.every_steps=2", "--set", "budget.no_signal_steps=0"]   # an untrained policy


def _up() -> bool:
    return subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A running local Slurm cluster, or a skip saying why there is none.  Jobs that ended
    test sessions left queued or running (they would hold the node) are cancelled first."""
    if _up():
        cancel_stale_test_jobs(tmp_path_factory.getbasetemp())
        yield
        return
    if os.environ.get("SCALECTL_NO_SLURM_START"):
        pytest.skip("the local Slurm cluster could not be started (SCALECTL_NO_SLURM_START is set by .ci/run)")
    if os.geteuid() != 0:
        pytest.skip("no Slurm cluster is running and starting one needs root (sudo scripts/slurm-local.sh start)")
    proc = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.skip(f"scripts/slurm-local.sh start failed: {(proc.stdout + proc.stderr).strip()[-800:]}")
    cancel_stale_test_jobs(tmp_path_factory.getbasetemp())
    yield
    subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def policy(tmp_path_factory) -> str:
    """A freshly initialised tiny policy (no warm start: these tests are about launching)."""
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    return str(save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("policy") / "tiny"))


@pytest.fixture
def submitted():
    """Job ids a test submits; whatever is still queued or running at its end is cancelled."""
    ids: list[str] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


def _status(db, name) -> dict:
    rows = json.loads(run_cli("status", "--json", db=db, check=True).stdout)
    return next(r for r in rows if r["name"] == name)


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _wait_status(db, name, states, timeout=240):
    return _wait(lambda: (r := _status(db, name))["status"] in states and r, timeout,
                 f"run {name} to be {'/'.join(states)}")


def _points(db, name) -> list[dict]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(
            "SELECT p.* FROM eval_points p JOIN runs r ON r.id = p.run_id WHERE r.name = ? ORDER BY step", [name])]


def _submit(tmp_path, policy, submitted, name, *args) -> dict:
    proc = run_cli("run", "recipes/grpo.toml", "--launcher", "slurm", "--json", "--name", name, "--new-run",
                   "--runs-dir", str(tmp_path / "runs"), *TINY, "--set", f"model.path={policy}", *args,
                   db=tmp_path / "s.db")
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)
    submitted.append(job["job_id"])
    return job


#: The preemption test's budget: room for two interruptions between checkpoints (every 2 steps).
LAST = 12


def _step_of(checkpoint: str) -> int:
    return int(checkpoint.split("-")[1]) if checkpoint else -1


def _scontrol(job_id) -> dict:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(t.split("=", 1) for t in out.split() if "=" in t)


#: sacct's words for a job that has ended.
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE")


def _sacct(job_id: str) -> dict:
    """What accounting says of job ``job_id`` (``123`` or ``123_4``): its name and state word."""
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,JobName,State"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        jid, name, state = line.split("|")
        if jid == job_id:
            return {"name": name, "state": state}
    return {}


def _sacct_ended(job_id: str, timeout: float = 120) -> dict:
    """Accounting's record of job ``job_id`` once it says the job has ended."""
    return _wait(lambda: (row := _sacct(job_id)) and row["state"].split(" ")[0] in ENDED and row, timeout,
                 f"sacct to say that job {job_id} has ended")


def test_two_task_job_roles_talk_over_gloo(slurm, tmp_path):
    """Task 0 is the generator, task 1 the trainer; the trainer sends a tensor, the generator answers."""
    from scalectl.rl.transport.roles import exchange_check
    from scalectl.launch.slurm import submit_function, wait

    job = submit_function(exchange_check, 1, 1, folder=tmp_path / "roles",
                          params={"job_name": "roles", "ntasks_per_node": 2, "cpus_per_task": 1, "time": 5,
                                  "stderr_to_stdout": True})
    generator, trainer = wait(job, timeout_s=180)
    assert (generator["role"], generator["rank"], trainer["role"], trainer["rank"]) == ("generator", 0, "trainer", 1)
    assert generator["backend"] == trainer["backend"] == "gloo"
    assert generator["source"] == "slurm" and generator["world_size"] == 2
    assert trainer["sent"] == [[1.0, 2.0, 3.0]] and generator["received"] == [[1.0, 2.0, 3.0]]
    assert generator["sent"] == [[10.0, 20.0, 30.0]] == trainer["received"]     # x * 10 + rank 0


def _latest_checkpoint(run_dir: Path) -> str:
    pointer = run_dir / "checkpoints" / "latest"
    return pointer.read_text().strip() if pointer.exists() else ""


@pytest.mark.slow
def test_slurm_run_and_a_preempted_run_end_with_the_same_points(slurm, policy, submitted, tmp_path):
    """Two runs of one recipe at once: one uninterrupted; the other pre-empted twice,
    first by SIGUSR2 (what Slurm sends before a time limit or a pre-emption: submitit
    calls the job's checkpoint() and requeues it), then by `scontrol requeue` (the job
    is killed and restarts with its first arguments).  Both resume from the last
    checkpoint and end with the same evaluation points: contiguous, none duplicated."""
    db = tmp_path / "s.db"
    t0 = time.monotonic()
    plain = _submit(tmp_path, policy, submitted, "plain", "--set", f"budget.steps={LAST}")
    preempted = _submit(tmp_path, policy, submitted, "preempted", "--set", f"budget.steps={LAST}")
    assert plain["job_id"].isdigit() and preempted["job_id"].isdigit()
    run_dir, job_id = Path(preempted["run_dir"]), preempted["job_id"]

    # the checkpoints seen here depend on how often this process is scheduled, not only on the job:
    # any checkpoint before the last step will do, and the job must resume from that one
    first_ckpt = _wait(lambda: _step_of(_latest_checkpoint(run_dir)) in range(2, LAST - 2) and _latest_checkpoint(run_dir),
                       240, "a checkpoint before the last steps")
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
    row = _wait_status(db, "preempted", ("pending",), timeout=60)
    assert row["error"] == "requeued after pre-emption or time limit; resumes from its last checkpoint"

    log = Path(preempted["log"])
    _wait(lambda: f"resumed from {first_ckpt}" in log.read_text() and _latest_checkpoint(run_dir) != first_ckpt,
          240, f"the restarted job's first checkpoint after {first_ckpt}")
    subprocess.run(["scontrol", "requeue", job_id], check=True)

    for name, job in (("plain", plain), ("preempted", preempted)):
        _wait(lambda: _scontrol(job["job_id"]).get("JobState") == "COMPLETED", 300, f"job {name} to complete")
    with sqlite3.connect(db) as conn:   # run created (just before sbatch) -> first point, to the second
        created, first = conn.execute("SELECT r.created, MIN(p.time) FROM runs r JOIN eval_points p "
                                      "ON p.run_id = r.id WHERE r.name = 'plain'").fetchone()
    latency = datetime.fromisoformat(first) - datetime.fromisoformat(created)
    print(f"\nsubmit-to-first-point latency {latency.total_seconds():.0f} s; both runs done after "
          f"{time.monotonic() - t0:.1f} s")

    rows = {r["name"]: r for r in json.loads(run_cli("status", "--json", db=db, check=True).stdout)}
    for name, job in (("plain", plain), ("preempted", preempted)):
        assert rows[name]["status"] == "completed", rows[name]["error"]
        assert rows[name]["launcher"] == "slurm" and rows[name]["job_ids"] == [job["job_id"]]
        assert rows[name]["last_step"] == LAST
    assert int(_scontrol(job_id)["Restarts"]) == 2                      # one job, requeued twice in place
    text = log.read_text()
    assert "Calling checkpoint method" in text and "DUE TO JOB REQUEUE" in text
    # the requeue lands after a later checkpoint (the final one when the job got there first: a
    # busy machine decides which); each restart resumes from the checkpoint latest at its signal
    resumed = re.findall(r"resumed from step-(\d+)", text)
    assert len(resumed) == 2 and f"step-{resumed[0]}" == first_ckpt and int(resumed[1]) > int(resumed[0])
    keys = ("step", "tokens", "samples", "flops", "pass_rate", "truncation_rate", "mean_length")
    reference = [{k: p[k] for k in keys} for p in _points(db, "plain")]
    assert [p["step"] for p in reference] == list(range(0, LAST + 1, 2))
    assert [{k: p[k] for k in keys} for p in _points(db, "preempted")] == reference


def _submit_array(tmp_path, policy, submitted, names, budget_steps) -> list:
    """Runs created as `scalectl run` creates them, submitted together by
    SlurmLauncher.submit_many: one job array (executor.batch())."""
    from scalectl.job.body import write_job_file
    from scalectl.launch.base import RunSpec
    from scalectl.launch.slurm import SlurmLauncher
    from scalectl.recipe.load import load
    from scalectl.store.database import Store

    overrides = [a for a in TINY if a != "--set"] + [f"model.path={policy}", f"budget.steps={budget_steps}",
                                                     f"launcher.max_parallel={len(names)}"]
    specs = []
    with Store.open(tmp_path / "s.db") as store:
        for seed, name in enumerate(names):
            recipe = load(ROOT / "recipes/grpo.toml", ROOT / "setups/tiny-cpu.toml", overrides + [f"seed={seed}"])
            run_dir = tmp_path / "runs" / name
            run_id = store.create_run(name, recipe=recipe.to_dict(), recipe_hash=recipe.content_hash, seed=seed,
                                      launcher="slurm", run_dir=str(run_dir), status="pending")
            write_job_file(run_dir, db=store.path, run_id=run_id, recipe=recipe.to_dict())
            specs.append(RunSpec(run_id, name, run_dir, recipe))
        jobs = SlurmLauncher().submit_many(specs, job_name="seeds")
        for spec, job in zip(specs, jobs):
            store.add_job_id(spec.run_id, job.job_id)
            submitted.append(job.job_id)
    return jobs


def test_job_array_scancel_and_killed_jobs_show_in_status(slurm, policy, submitted, tmp_path):
    """Two runs as one job array (both running at once, launcher.max_parallel = 2); one
    is cancelled with scancel, the other's process is killed: `scalectl status` says
    cancelled for the first, failed with the log tail for the second."""
    db = tmp_path / "s.db"
    cancelled, killed = _submit_array(tmp_path, policy, submitted, ["cancelled", "killed"], budget_steps=1000)
    array_id = cancelled.job_id.split("_")[0]
    assert (cancelled.job_id, killed.job_id) == (f"{array_id}_0", f"{array_id}_1")
    script = (Path(cancelled.info["folder"]) / f"{array_id}_submission.sh").read_text()
    assert "#SBATCH --array=0-1%2" in script and "#SBATCH --job-name=seeds" in script
    _wait_status(db, "cancelled", ("running",), timeout=120)
    _wait(lambda: f"Slurm job {cancelled.job_id} task 0/1" in Path(cancelled.log).read_text(), 30, "the job's log")
    subprocess.run(["scancel", cancelled.job_id], check=True)
    row = _wait_status(db, "cancelled", ("cancelled", "failed", "completed"), timeout=30)
    assert row["status"] == "cancelled" and row["job_ids"] == [cancelled.job_id]
    assert row["error"].startswith(f"the job was cancelled (slurm job {cancelled.job_id}: CANCELLED")
    # a job whose process is killed outright (as the OOM killer does) records nothing:
    # failed, with its log tail
    _wait_status(db, "killed", ("running",), timeout=120)
    raw_id = _scontrol(killed.job_id)["JobId"]          # listpids wants the array task's own id
    listed = subprocess.run(["scontrol", "listpids", raw_id], capture_output=True, text=True).stdout
    pids = [int(line.split()[0]) for line in listed.splitlines()[1:] if line.split()]

    def is_task(pid: int) -> bool:        # the Python task itself, not srun or the batch shell
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return Path(argv[0].decode()).name.startswith("python") and b"submitit.core._submit" in argv

    task = [p for p in pids if is_task(p)]
    assert len(task) == 1, listed
    for pid in task:
        os.kill(pid, signal.SIGKILL)
    row = _wait_status(db, "killed", ("failed", "cancelled", "completed"), timeout=60)
    assert row["status"] == "failed"
    assert row["error"].startswith(f"the job ended without recording a result (slurm job {killed.job_id}: FAILED")
    assert "log tail:" in row["error"] and "task 0: Killed" in row["error"]     # srun says so in the log



PIPE = ["--set", "batch.prompts_per_step=8", "--set", "batch.generations_per_prompt=8", "--set", "eval.prompts=16",
        "--set", "eval.samples_per_prompt=2", "--set", "eval.every_steps=3", "--set", "checkpoint.every_steps=3",
        "--set", "async.k=1", "--set", "data.train_size=400", "--set", "hardware.generators=2",
        "--set", "hardware.trainers=2", "--set", "filter.zero_variance=false",
        "--set", "launcher.slurm.tasks_per_node=4", "--set", "budget.no_signal_steps=0"]
#: The local node has 2 CPUs for the job's 4 one-CPU tasks: sbatch's --overcommit lets them share.
OVERCOMMIT = {"SBATCH_OVERCOMMIT": "1"}


def _task_pids(job_id: str) -> dict[int, int]:
    """SLURM_PROCID -> pid of each Python task of a running job (not srun, not the batch shell)."""
    listed = subprocess.run(["scontrol", "listpids", job_id], capture_output=True, text=True).stdout
    out = {}
    for line in listed.splitlines()[1:]:
        if not line.split():
            continue
        pid = int(line.split()[0])
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = dict(v.split(b"=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if Path(argv[0].decode()).name.startswith("python") and b"submitit.core._submit" in argv:
            out[int(env[b"SLURM_PROCID"])] = pid
    return out


def _job_pids(job_id: str) -> list[int]:
    """Every process of a running job (batch shell, srun, tasks and what they started)."""
    listed = subprocess.run(["scontrol", "listpids", job_id], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in listed.splitlines()[1:] if line.split()]


@pytest.mark.slow
def test_pipeline_of_two_generators_and_two_trainers_as_one_four_task_job(slurm, policy, submitted, tmp_path):
    """The 2 + 2 pipeline as one Slurm job of 4 tasks (2 generators, 2 data-parallel trainers): it
    lands its points.  In two more such jobs a trainer task is killed (SIGKILL): the second trainer
    rank in one, the first (which records the run) in the other.  Each run fails within a minute
    with its error naming the killed task, its pid and its log; no process of either job is left;
    `scalectl run --resume` completes the first from its last checkpoint."""
    db = tmp_path / "s.db"
    jobs = {}
    for name, budget in (("landed", 6), ("follower", 1_000_000), ("leader", 1_000_000)):
        proc = run_cli("run", "recipes/scalerl.toml", "--launcher", "slurm", "--json", "--name", name, "--new-run",
                       "--runs-dir", str(tmp_path / "runs"), "--set", f"model.path={policy}", *PIPE,
                       "--set", f"budget.steps={budget}", db=db, env=OVERCOMMIT)
        assert proc.returncode == 0, proc.stderr
        jobs[name] = json.loads(proc.stdout)
        submitted.append(jobs[name]["job_id"])
    for name, victim, role_rank in (("follower", 3, 1), ("leader", 2, 0)):
        job, run_dir = jobs[name], Path(jobs[name]["run_dir"])
        _wait(lambda: _latest_checkpoint(run_dir), 300, f"the first checkpoint of run {name}")
        tasks = _task_pids(job["job_id"])
        assert sorted(tasks) == [0, 1, 2, 3]
        every = _job_pids(job["job_id"])
        t0 = time.monotonic()
        os.kill(tasks[victim], signal.SIGKILL)
        row = _wait_status(db, name, ("failed", "cancelled", "completed"), timeout=120)
        took = time.monotonic() - t0
        log = Path(job["log"]).with_name(f"{job['job_id']}_{victim}_log.out")
        assert row["status"] == "failed"
        assert (f"TaskLost: trainer task {victim} (trainer rank {role_rank}, pid {tasks[victim]} on "
                f"{socket.gethostname()}) stopped answering (log: {log})") in row["error"], row["error"]
        assert took < 60, f"run {name} was marked failed {took:.0f} s after the kill"
        # the task that records the failure cancels the job (SlurmRunJob.end_job): CANCELLED, or FAILED
        # when every task has already left
        _wait(lambda: _scontrol(job["job_id"]).get("JobState") in ("CANCELLED", "FAILED", None), 60,
              f"job {name} to end")
        _wait(lambda: not [p for p in every if Path(f"/proc/{p}").exists()], 30,
              f"every process of job {name} to exit")

    run_dir = Path(jobs["follower"]["run_dir"])
    stopped = int(_latest_checkpoint(run_dir).split("-")[1])
    resumed = run_cli("run", "--resume", "follower", "--runs-dir", str(tmp_path / "runs"), "--json",
                      "--set", f"budget.steps={stopped + 3}", db=db, env=OVERCOMMIT)
    assert resumed.returncode == 0, resumed.stderr
    submitted.append(json.loads(resumed.stdout)["job_id"])
    for name in ("landed", "follower"):
        row = _wait_status(db, name, ("completed", "failed", "cancelled"), timeout=300)
        assert row["status"] == "completed", (name, row["error"])
    assert [p["step"] for p in _points(db, "landed")] == [0, 3, 6]
    assert [p["step"] for p in _points(db, "follower")] == list(range(0, stopped + 4, 3))
    landed = Path(jobs["landed"]["log"])
    assert "trainer rank 1 followed 6 step(s)" in landed.with_name(f"{jobs['landed']['job_id']}_3_log.out").read_text()


@pytest.mark.slow
def test_cancel_checkpoints_a_running_slurm_run_and_resume_completes_it(slurm, policy, submitted, tmp_path):
    """`scalectl cancel` stops a running Slurm run as Ctrl-C stops a local one: the job's tasks
    get SIGINT, the job body saves a checkpoint at the step it reached and records the run
    cancelled; `run --resume` trains on from that checkpoint to the budget, one point per
    evaluation step."""
    db = tmp_path / "s.db"
    job = _submit(tmp_path, policy, submitted, "stopped", "--set", "budget.steps=1000")
    run_dir = Path(job["run_dir"])
    _wait(lambda: _latest_checkpoint(run_dir), 240, "a first checkpoint")
    run_cli("cancel", "stopped", db=db, check=True, timeout=300)
    row = _wait_status(db, "stopped", ("cancelled", "failed", "completed"), timeout=120)
    assert row["status"] == "cancelled", row["error"]
    assert row["error"] == "interrupted (resume with --resume)"      # the job body's word, not the launcher's
    # Slurm says so too: the job cancels itself once the run is recorded and checkpointed
    assert _sacct_ended(job["job_id"])["state"].startswith("CANCELLED"), _sacct(job["job_id"])
    stopped_at = int(_latest_checkpoint(run_dir).split("-")[1])
    log = Path(job["log"]).read_text()
    saving = log.index(f"interrupted at step {stopped_at}: saving a checkpoint")
    assert log.index(f"ending Slurm job {job['job_id']}: the run is recorded cancelled and checkpointed") > saving

    budget = stopped_at + (2 - stopped_at % 2) + 2               # two evaluation steps past the checkpoint
    resumed = run_cli("run", "--resume", "stopped", "--set", f"budget.steps={budget}", "--json", db=db, check=True)
    submitted.append(json.loads(resumed.stdout)["job_id"])
    row = _wait_status(db, "stopped", ("completed", "failed", "cancelled"), timeout=300)
    assert row["status"] == "completed", row["error"]
    assert [p["step"] for p in _points(db, "stopped")] == list(range(0, budget + 1, 2))



@pytest.mark.slow
def test_cancel_of_a_two_task_pipeline_job_reads_cancelled_after_both_tasks_are_done(slurm, policy, submitted,
                                                                                     tmp_path):
    """A 1 + 1 pipeline as one job of two tasks (generator task 0, trainer task 1).  `scalectl cancel`
    interrupts both; the trainer saves its checkpoint and records the run cancelled, the generator
    stops; only once both have written how they ended is the job cancelled, and sacct says CANCELLED."""
    db = tmp_path / "s.db"
    sets = [*PIPE, "--set", "hardware.generators=1", "--set", "hardware.trainers=1",
            "--set", "launcher.slurm.tasks_per_node=2", "--set", "budget.steps=1000000"]
    proc = run_cli("run", "recipes/scalerl.toml", "--launcher", "slurm", "--json", "--name", "pair",
                   "--runs-dir", str(tmp_path / "runs"), "--set", f"model.path={policy}", *sets, db=db,
                   env=OVERCOMMIT)
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)
    submitted.append(job["job_id"])
    run_dir = Path(job["run_dir"])
    _wait(lambda: _latest_checkpoint(run_dir), 300, "a first checkpoint")
    assert sorted(_task_pids(job["job_id"])) == [0, 1]
    run_cli("cancel", "pair", db=db, check=True, timeout=300)
    row = _wait_status(db, "pair", ("cancelled", "failed", "completed"), timeout=120)
    assert (row["status"], row["error"]) == ("cancelled", "interrupted (resume with --resume)")
    assert _sacct_ended(job["job_id"])["state"].startswith("CANCELLED"), _sacct(job["job_id"])
    ended = Path(job["log"]).parent / f"ended-{job['job_id']}-0"
    assert sorted(p.name for p in ended.iterdir()) == ["0.interrupted", "1.cancelled"]
    stopped_at = int(_latest_checkpoint(run_dir).split("-")[1])
    trainer = Path(job["log"]).with_name(f"{job['job_id']}_1_log.out").read_text()
    assert f"interrupted at step {stopped_at}: saving a checkpoint" in trainer
    logs = Path(job["log"]).read_text() + trainer
    assert logs.count(f"ending Slurm job {job['job_id']}: the run is recorded cancelled and checkpointed, "
                      "and all 2 tasks have done their part") >= 1

ABLATION = "lmhead"
VARIANTS = [f"{ABLATION}--base--s0", f"{ABLATION}--bf16--s0"]


def _ablate(tmp_path, policy) -> subprocess.Popen:
    """`scalectl ablate` of two variants on Slurm: one job array of two tasks running at once, each
    with a budget it will not reach, so that the command watches them until it is interrupted."""
    args = ["ablate", "--forward", "precision.lm_head=fp32,bf16", "--name", ABLATION, "--launcher", "slurm",
            "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--budget-steps", "1000",
            "--poll", "0.5", *TINY, "--set", f"model.path={policy}", "--set", "launcher.max_parallel=2"]
    env = dict(os.environ, COLUMNS="200", SCALECTL_DB=str(tmp_path / "s.db"))
    return subprocess.Popen([SCALECTL, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.slow
def test_an_ablation_array_named_after_it_whose_cancelled_tasks_read_cancelled(slurm, policy, submitted, tmp_path):
    """An ablation's two runs train as tasks 0 and 1 of one job array, which squeue and sacct name after
    the ablation.  `scalectl cancel` stops task 1:
    its run is checkpointed and recorded cancelled, and sacct says CANCELLED, not FAILED; Ctrl-C on the
    ablation then cancels task 0 the same way, while task 1's record stays as it was."""
    db = tmp_path / "s.db"
    ablate = _ablate(tmp_path, policy)
    try:
        dirs = {n: tmp_path / "runs" / n for n in VARIANTS}
        _wait(lambda: all(_latest_checkpoint(d) for d in dirs.values()) or ablate.poll() is not None, 300,
              "a first checkpoint of both runs")
        assert ablate.poll() is None, ablate.communicate()
        rows = {n: _status(db, n) for n in VARIANTS}
        jobs = {n: rows[n]["job_ids"][-1] for n in VARIANTS}
        submitted.extend(jobs.values())
        array = jobs[VARIANTS[0]].split("_")[0]
        assert jobs == {VARIANTS[0]: f"{array}_0", VARIANTS[1]: f"{array}_1"}
        # the array bears the ablation's name, not submit_many's default
        queued = subprocess.run(["squeue", "-h", "-j", array, "-o", "%i|%j|%T"], capture_output=True,
                                text=True).stdout.split()
        assert sorted(queued) == [f"{array}_0|{ABLATION}|RUNNING", f"{array}_1|{ABLATION}|RUNNING"]

        run_cli("cancel", VARIANTS[1], db=db, check=True, timeout=300)
        row = _wait_status(db, VARIANTS[1], ("cancelled", "failed", "completed"), timeout=120)
        assert (row["status"], row["error"]) == ("cancelled", "interrupted (resume with --resume)")
        assert _sacct_ended(jobs[VARIANTS[1]])["state"].startswith("CANCELLED"), _sacct(jobs[VARIANTS[1]])
        assert _scontrol(jobs[VARIANTS[0]]).get("JobState") == "RUNNING"      # the other task trains on

        ablate.send_signal(signal.SIGINT)
        _, stderr = ablate.communicate(timeout=300)
        assert ablate.returncode == 130, stderr
        for n in VARIANTS:
            row = _status(db, n)
            assert (row["status"], row["error"]) == ("cancelled", "interrupted (resume with --resume)"), n
            assert _sacct_ended(jobs[n])["state"].startswith("CANCELLED"), _sacct(jobs[n])
            assert _sacct(jobs[n])["name"] == ABLATION
            stopped_at = int(_latest_checkpoint(dirs[n]).split("-")[1])
            log = Path(json.loads((dirs[n] / "launch.json").read_text())["jobs"][-1]["log"]).read_text()
            assert log.index(f"ending Slurm job {jobs[n]}: the run is recorded cancelled") > \
                log.index(f"interrupted at step {stopped_at}: saving a checkpoint")
    finally:
        if ablate.poll() is None:
            ablate.kill()
            ablate.communicate()


def _script(job: dict) -> str:
    """The sbatch script submitit wrote for job ``job`` (``scalectl run --json``'s output)."""
    return (Path(job["log"]).parent / f"{job['job_id']}_submission.sh").read_text()


def _row(db, name) -> dict:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return dict(conn.execute("SELECT * FROM runs WHERE name = ?", [name]).fetchone())


#: 1 generator + 1 trainer placed by role: a generator node and a trainer node, named.
BY_ROLE = [*PIPE, "--set", "hardware.generators=1", "--set", "hardware.trainers=1", "--set", "launcher.slurm.nodes=2",
           "--set", "launcher.slurm.generator_nodes=1", "--set", "launcher.slurm.tasks_per_node=1",
           "--set", "launcher.slurm.generator_nodelist=localhost"]


@pytest.mark.long
def test_a_run_pinned_to_a_node_that_is_gone_is_resumed_on_another(slurm, policy, submitted, tmp_path):
    """A run whose trainer is pinned (launcher.slurm.trainer_nodelist) to a node the cluster does not
    have waits in the queue.  Cancelled, it is resumed with --set launcher.slurm.trainer_nodelist=...:
    the new job's sbatch script and the controller name the new node, and the stored run keeps its id
    and recipe hash.  A placement the job would refuse, and any key beyond the placement and the
    budget, is refused with exit status 2 and changes nothing."""
    db = tmp_path / "s.db"
    proc = run_cli("run", "recipes/scalerl.toml", "--launcher", "slurm", "--json", "--name", "pinned",
                   "--runs-dir", str(tmp_path / "runs"), "--set", f"model.path={policy}", *BY_ROLE,
                   "--set", "launcher.slurm.trainer_nodelist=gone1", "--set", "budget.steps=1000", db=db)
    assert proc.returncode == 0, proc.stderr
    first = json.loads(proc.stdout)
    submitted.append(first["job_id"])
    assert "#SBATCH --nodelist=localhost,gone1" in _script(first)
    assert "--trainer-nodelist gone1" in _script(first)
    # the one-node cluster has no second node: the job waits (as one pinned to a dead node does)
    assert _wait(lambda: (_scontrol(first["job_id"]).get("Reason") not in (None, "None")) and
                 _scontrol(first["job_id"]), 60, "the controller to say why the job waits")["JobState"] == "PENDING"
    run_cli("cancel", "pinned", db=db, check=True, timeout=120)
    assert _wait_status(db, "pinned", ("cancelled",), timeout=60)["status"] == "cancelled"
    before = _row(db, "pinned")
    job_file = (Path(first["run_dir"]) / "job.json").read_text()

    for sets, says in ((["launcher.slurm.nodes=3"], "--set launcher.slurm.nodes: a resumed run keeps its recipe; "
                                                     "only budget.steps"),
                       (["loss.type=gspo"], "--set loss.type: a resumed run keeps its recipe"),
                       (["launcher.slurm.trainer_nodelist=spare[1-2]"],
                        "launcher.slurm.trainer_nodelist = 'spare[1-2]' names 2 host(s), but the role has 1 node(s)"),
                       (["launcher.slurm.trainer_nodelist=localhost"],
                        "generator_nodelist and trainer_nodelist share hosts")):
        refused = run_cli("run", "--resume", "pinned", *[a for s in sets for a in ("--set", s)], db=db)
        assert refused.returncode == 2 and says in refused.stderr and "Traceback" not in refused.stderr, \
            (sets, refused.stderr)
        assert _row(db, "pinned") == before and (Path(first["run_dir"]) / "job.json").read_text() == job_file

    resumed = run_cli("run", "--resume", "pinned", "--set", "launcher.slurm.trainer_nodelist=spare1", "--json", db=db)
    assert resumed.returncode == 0, resumed.stderr
    again = json.loads(resumed.stdout)
    submitted.append(again["job_id"])
    assert (f"run pinned: launcher.slurm.trainer_nodelist = 'spare1' (was 'gone1'); its recipe hash stays "
            f"{before['recipe_hash']}") in resumed.stderr
    script = _script(again)
    assert "#SBATCH --nodelist=localhost,spare1" in script and "--trainer-nodelist spare1" in script
    assert "gone1" not in script
    asked = _scontrol(again["job_id"])
    assert sorted(asked["ReqNodeList"].split(",")) == ["localhost", "spare1"], asked
    after = _row(db, "pinned")
    assert (after["id"], after["recipe_hash"]) == (before["id"], before["recipe_hash"])
    assert json.loads(after["job_ids"]) == [first["job_id"], again["job_id"]]
    for recipe in (json.loads(after["recipe"]), json.loads((Path(first["run_dir"]) / "job.json").read_text())["recipe"]):
        assert recipe["launcher"]["slurm"]["trainer_nodelist"] == "spare1"
        assert recipe["launcher"]["slurm"]["generator_nodelist"] == "localhost"


@pytest.mark.slow
def test_a_trained_run_resumed_on_a_named_node_keeps_its_hash_and_points(slurm, policy, submitted, tmp_path):
    """A run trains unpinned and is cancelled after its first checkpoint; --resume with
    launcher.slurm.additional_parameters.nodelist and launcher.slurm.partition sends its next job
    there (its sbatch script and the controller say so); the run keeps its id, its hash and every
    point, and trains on from its checkpoint."""
    db = tmp_path / "s.db"
    first = _submit(tmp_path, policy, submitted, "moved", "--set", "budget.steps=1000")
    run_dir = Path(first["run_dir"])
    assert "--nodelist" not in _script(first) and "--partition" not in _script(first)
    _wait(lambda: _latest_checkpoint(run_dir), 240, "a first checkpoint")
    run_cli("cancel", "moved", db=db, check=True, timeout=300)
    assert _wait_status(db, "moved", ("cancelled", "failed", "completed"))["status"] == "cancelled"
    before, points = _row(db, "moved"), _points(db, "moved")
    stopped = _latest_checkpoint(run_dir)
    assert points and points[-1]["step"] <= int(stopped.split("-")[1])

    resumed = run_cli("run", "--resume", "moved", "--set", "launcher.slurm.additional_parameters.nodelist=localhost",
                      "--set", "launcher.slurm.partition=debug", "--json", db=db)
    assert resumed.returncode == 0, resumed.stderr
    again = json.loads(resumed.stdout)
    submitted.append(again["job_id"])
    script = _script(again)
    assert "#SBATCH --nodelist=localhost" in script and "#SBATCH --partition=debug" in script
    asked = _scontrol(again["job_id"])
    assert (asked["ReqNodeList"], asked["Partition"]) == ("localhost", "debug")
    log = Path(again["log"])
    _wait(lambda: log.exists() and f"resumed from {stopped}" in log.read_text()
          and _latest_checkpoint(run_dir) != stopped, 240, f"a checkpoint after {stopped}")
    run_cli("cancel", "moved", db=db, check=True, timeout=300)
    assert _wait_status(db, "moved", ("cancelled", "failed", "completed"))["status"] == "cancelled"
    after = _row(db, "moved")
    assert (after["id"], after["recipe_hash"]) == (before["id"], before["recipe_hash"])
    assert json.loads(after["job_ids"]) == [first["job_id"], again["job_id"]]
    later = _points(db, "moved")
    assert later[:len(points)] == points and later[-1]["step"] > points[-1]["step"]     # kept, then more
