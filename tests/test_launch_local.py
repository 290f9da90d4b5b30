"""Launch machinery without Slurm: state reconciliation, roles, sbatch parameters,
and detached local jobs (slots, failure, death, cancel) as real processes."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from scalectl.errors import UserError
from scalectl.launch.base import log_tail, reconcile
from scalectl.launch.local import acquire_slot, pid_alive
from scalectl.rl.transport.roles import assign_role, detect, first_host, local_task_env, slurm_port
from scalectl.launch.slurm import job_tasks, map_state, signal_delay_s, submitit_parameters
from scalectl.recipe.load import load

# --------------------------------------------------------------------------- pure rules


@pytest.mark.parametrize("store, launcher, expected", [
    ("running", None, None),             # launcher cannot tell: keep
    ("running", "running", None),
    ("running", "pending", "pending"),    # requeued (scontrol requeue, preemption)
    ("pending", "running", "running"),
    ("created", "pending", "pending"),
    ("running", "cancelled", "cancelled"),  # scancel: the body never wrote it
    ("running", "completed", "failed"),   # the job ended without recording a result
    ("pending", "ended", "failed"),       # local process gone
    ("running", "timed_out", "timed_out"),
    ("running", "failed", "failed"),
    ("running", "active", None),          # local process alive: keep the body's phase
    ("completed", "cancelled", None),     # the body finished: its word stands
    ("completed", "running", None),
    ("cancelled", "running", None),       # cancelled, still COMPLETING
    ("failed", "pending", None),
])
def test_reconcile(store, launcher, expected):
    assert reconcile(store, launcher) == expected


@pytest.mark.parametrize("word, state", [
    ("RUNNING", "running"), ("PENDING", "pending"), ("REQUEUED", "pending"), ("COMPLETING", "active"),
    ("COMPLETED", "completed"), ("CANCELLED by 0", "cancelled"), ("TIMEOUT", "timed_out"),
    ("OUT_OF_MEMORY+", "failed"), ("NODE_FAIL", "failed"), ("PREEMPTED", "failed"), ("", None), ("WEIRD", None),
])
def test_map_slurm_state(word, state):
    assert map_state(word) == state


def test_first_host():
    assert first_host("localhost") == "localhost"
    assert first_host("node[003-005,9],gpu1") == "node003"
    assert first_host("gpu7,gpu8") == "gpu7"
    assert first_host("a-b[10-11]") == "a-b10"
    with pytest.raises(ValueError):
        first_host("")


def test_assign_role_first_generators_then_trainers():
    # ScaleRL paper: 64 generators + 16 trainers
    assert assign_role(0, 64, 16) == ("generator", 0, 64)
    assert assign_role(63, 64, 16) == ("generator", 63, 64)
    assert assign_role(64, 64, 16) == ("trainer", 0, 16)
    assert assign_role(79, 64, 16) == ("trainer", 15, 16)
    with pytest.raises(ValueError):
        assign_role(80, 64, 16)


def test_detect_from_slurm_env():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "20123",
           "SLURM_JOB_NODELIST": "node[07-08]"}
    task = detect(1, 1, env)
    assert (task.role, task.rank, task.world_size, task.local_rank, task.role_rank) == ("trainer", 1, 2, 1, 0)
    assert (task.master_addr, task.master_port, task.source) == ("node07", 20000 + 123, "slurm")
    assert slurm_port("45678_3") == 20000 + 5678
    assert detect(1, 1, dict(env, SCALECTL_MASTER_PORT="31000")).master_port == 31000


def test_detect_from_local_spawn_env_and_single():
    task = detect(2, 1, local_task_env(1, 3, port=29999))
    assert (task.role, task.role_rank, task.role_size, task.master_port, task.source) == ("generator", 1, 2, 29999, "env")
    single = detect(1, 1, {})
    assert (single.rank, single.world_size, single.source) == (0, 1, "single")
    with pytest.raises(UserError, match="the job has 3 tasks but hardware asks for 1 generators \\+ 1 trainers = 2"):
        detect(1, 1, local_task_env(0, 3, port=1))


def test_submitit_parameters_paper_setup():
    recipe = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/paper-8b.toml", [])
    p = submitit_parameters(recipe, "scalerl-s0")
    # setups/paper-8b.toml: 10 nodes x 8 tasks, 8 GPUs and 12 CPUs each, 1000 GB, 4320 min
    assert {k: p[k] for k in ("job_name", "time", "nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task", "mem")} == {
        "job_name": "scalerl-s0", "time": 4320, "nodes": 10, "ntasks_per_node": 8, "gpus_per_node": 8,
        "cpus_per_task": 12, "mem": "1000GB"}
    assert p["signal_delay_s"] == 90 and p["stderr_to_stdout"] is True
    assert p["additional_parameters"] == {"requeue": True}
    tiny = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml",
                ["launcher.slurm.tasks_per_node=4", "hardware.generators=2", "hardware.trainers=2"])
    p = submitit_parameters(tiny, "t")     # one node: sbatch --ntasks, which --overcommit can share out
    assert "ntasks_per_node" not in p and p["nodes"] == 1
    assert p["additional_parameters"] == {"requeue": True, "ntasks": 4} and job_tasks(p) == 4
    assert job_tasks({"nodes": 10, "ntasks_per_node": 8}) == 80 and job_tasks({}) == 1
    tiny = load(ROOT / "recipes/grpo.toml", ROOT / "setups/tiny-cpu.toml",
                ["launcher.slurm.mem_gb=1.5", "launcher.slurm.time_min=1", "launcher.slurm.partition=debug"])
    p = submitit_parameters(tiny, "g")
    assert (p["mem"], p["time"], p["partition"], p["signal_delay_s"]) == ("1536MB", 1, "debug", 15)
    assert "gpus_per_node" not in p
    assert [signal_delay_s(m) for m in (1, 2, 6, 60)] == [15, 30, 90, 90]


def test_dry_run_prints_sbatch_script_without_slurm(tmp_path):
    proc = run_cli("run", "recipes/grpo.toml", "--launcher", "slurm", "--dry-run", "--json",
                   "--runs-dir", str(tmp_path / "runs"), "--set", "launcher.slurm.time_min=30", db=tmp_path / "s.db")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["launcher"] == "slurm" and data["run_name"] == "grpo-s0"
    lines = data["sbatch_script"].splitlines()
    folder = tmp_path.resolve() / "runs" / "grpo-s0" / "slurm" / "00"
    for expected in ("#SBATCH --job-name=grpo-s0", "#SBATCH --time=30", "#SBATCH --ntasks=1", "#SBATCH --nodes=1",
                     "#SBATCH --requeue", "#SBATCH --signal=USR2@90", f"#SBATCH --output={folder}/%j_0_log.out"):
        assert expected in lines
    assert data["submitit_parameters"]["time"] == 30
    assert not (tmp_path / "runs").exists() and not (tmp_path / "s.db").exists()   # nothing created


def test_log_tail(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(path, 3) == "line 97\nline 98\nline 99"
    assert log_tail(tmp_path / "missing.log") == ""


def test_slots_are_exclusive_and_freed(tmp_path):
    a = acquire_slot(tmp_path, 2)
    b = acquire_slot(tmp_path, 2)
    assert {Path(a.name).name, Path(b.name).name} == {"slot-0.lock", "slot-1.lock"}
    freed = Path(a.name).name
    a.close()
    c = acquire_slot(tmp_path, 2)
    assert Path(c.name).name == freed
    b.close()
    c.close()


# --------------------------------------------------------------------------- detached local jobs


def _wait(predicate, timeout=90.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _status(db, name):
    rows = json.loads(run_cli("status", "--json", db=db, check=True).stdout)
    return next(r for r in rows if r["name"] == name)


def _hold_slot(runs: Path):
    """Take the only slot (max_parallel = 1 in setups/tiny-cpu.toml) as another run would."""
    (runs / ".slots").mkdir(parents=True, exist_ok=True)
    fh = open(runs / ".slots" / "slot-0.lock", "a+")
    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fh


def _detach(tmp_path, name, *extra):
    # started as from a background shell (SIGINT ignored): `cancel` must still stop the job
    proc = run_cli("run", "recipes/grpo.toml", "--detach", "--json", "--name", name, "--new-run",
                   "--runs-dir", str(tmp_path / "runs"), "--set", "budget.steps=2", *extra, db=tmp_path / "s.db",
                   ignore_sigint=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_detached_run_waits_for_a_slot_then_records_its_failure(tmp_path):
    """A model folder checked at submission (scalectl.job.preflight) and gone when the slot frees:
    the job fails on it and records why."""
    import shutil

    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    db, runs = tmp_path / "s.db", tmp_path / "runs"
    model = save_policy(build_tiny_model(num_hidden_layers=1), build_tokenizer(), tmp_path / "missing-model")
    slot = _hold_slot(runs)
    job = _detach(tmp_path, "bad-data", "--set", f"model.path={model}")
    shutil.rmtree(model)
    assert job["launcher"] == "local" and job["job_id"].isdigit()
    log = Path(job["log"])
    _wait(lambda: log.exists() and "waiting for a free slot" in log.read_text(), what="the slot wait")
    row = _status(db, "bad-data")
    assert row["status"] == "pending" and row["job_ids"] == [job["job_id"]]
    assert row["launcher_state"] == "alive"
    slot.close()                                   # the slot frees: the job runs, and fails on its data
    row = _wait(lambda: (r := _status(db, "bad-data"))["status"] in ("failed", "completed") and r, what="failure")
    assert row["status"] == "failed"
    assert "missing-model" in row["error"]
    logs = run_cli("logs", "bad-data", db=db, check=True)
    assert "waiting for a free slot" in logs.stdout and "missing-model" in logs.stdout


@pytest.mark.long
def test_killed_and_cancelled_local_jobs(tmp_path):
    db, runs = tmp_path / "s.db", tmp_path / "runs"
    slot = _hold_slot(runs)
    killed = _detach(tmp_path, "killed")
    cancelled = _detach(tmp_path, "cancelled")
    for job in (killed, cancelled):
        _wait(lambda: Path(job["log"]).exists() and "waiting for a free slot" in Path(job["log"]).read_text(),
              what="the slot wait")
    # a job killed outright records nothing: status finds the process gone
    os.kill(int(killed["job_id"]), signal.SIGKILL)
    _wait(lambda: not pid_alive(int(killed["job_id"])), what="the kill")
    listed = {r["name"]: r["status"] for r in json.loads(run_cli("runs", "--json", db=db, check=True).stdout)}
    assert listed["killed"] == "failed"                       # `runs` sees what `status` sees
    row = _status(db, "killed")
    assert row["status"] == "failed"
    assert row["error"].startswith(f"the job ended without recording a result (local job {killed['job_id']}")
    assert "waiting for a free slot" in row["error"]          # the log tail
    # scalectl cancel: SIGINT, the job marks itself cancelled and exits
    proc = run_cli("cancel", "cancelled", "--json", db=db, check=True)
    assert json.loads(proc.stdout) == {"run": "cancelled", "status": "cancelled", "job_id": cancelled["job_id"]}
    assert not pid_alive(int(cancelled["job_id"]))
    assert _status(db, "cancelled")["error"] == "cancelled while waiting for a slot"
    slot.close()


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    """A freshly initialised tiny policy (no warm start: these tests are about launching)."""
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    return str(save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("policy") / "tiny"))


@pytest.mark.slow   # 35-45 s: make test-slow (cancel alone and resume alone are in the default suite)
def test_detached_training_cancelled_then_resumed(tmp_path, policy):
    """A detached run trains in the background; `scalectl cancel` makes it checkpoint and stop;
    `run --resume --detach` continues it to the end: evaluation steps contiguous, none twice."""
    db = tmp_path / "s.db"
    tiny = ["--set", "async.mode=sync", "--set", "batch.prompts_per_step=4", "--set", "batch.generations_per_prompt=4",
            "--set", "eval.every_steps=2", "--set", "eval.prompts=200", "--set", "eval.samples_per_prompt=4",
            "--set", "checkpoint.every_steps=2", "--set", f"model.path={policy}",
            "--set", "budget.no_signal_steps=0",  # an untrained policy: no step has a signal
            "--set", "budget.steps=1000000"]     # never reached: the cancel lands mid-run however fast the machine
    job = _detach(tmp_path, "bg", *tiny)
    run_dir = Path(job["run_dir"])
    _wait(lambda: (run_dir / "checkpoints" / "latest").exists(), 240, "the first checkpoint")
    proc = run_cli("cancel", "bg", "--json", db=db, check=True)
    assert json.loads(proc.stdout)["status"] == "cancelled"
    row = _status(db, "bg")
    assert row["status"] == "cancelled" and row["error"] == "interrupted (resume with --resume)"
    stopped_at = int((run_dir / "checkpoints" / "latest").read_text().split("-")[1])
    assert "cancelled: checkpoint saved" in Path(job["log"]).read_text()

    end = stopped_at - stopped_at % 2 + 4          # the resumed run ends 3 or 4 steps later, on an evaluation step
    resumed = json.loads(run_cli("run", "--resume", "bg", "--detach", "--json", "--set", f"budget.steps={end}",
                                 db=db, check=True).stdout)
    assert resumed["job_id"] != job["job_id"] and resumed["log"].endswith("local-1.log")
    row = _wait(lambda: (r := _status(db, "bg"))["status"] in ("completed", "failed") and r, 240, "completion")
    assert row["status"] == "completed", row["error"]
    assert row["job_ids"] == [job["job_id"], resumed["job_id"]]
    assert f"resumed from step-{stopped_at:06d}" in Path(resumed["log"]).read_text()
    points = json.loads(run_cli("show", "bg", "--json", db=db, check=True).stdout)["points"]
    assert [p["step"] for p in points] == list(range(0, end + 1, 2))


def test_detect_numbers_the_gpu_tasks_of_tensor_parallel_generators():
    """One Slurm task per GPU: 2 generators of 4 GPUs + 2 trainers are 10 tasks; generator g's
    first task (0, 4) is its process (ranks 0, 1 of the run's 4 processes, 4 GPUs from its local
    rank on), its other tasks only hold GPUs, and the trainers' tasks (8, 9) are processes 2, 3."""
    from scalectl.rl.transport.roles import GPU_ONLY, first_gpu, pin_gpus

    def task(rank):
        env = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "10", "SLURM_LOCALID": str(rank % 8),
               "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_ID": "7"}
        return detect(2, 2, env, gpus_per_generator=4)

    got = [task(r) for r in range(10)]
    assert [(t.role, t.rank, t.world_size, t.role_rank, t.gpus) for t in got] == [
        ("generator", 0, 4, 0, 4), (GPU_ONLY, 1, 10, 0, 1), (GPU_ONLY, 2, 10, 0, 1), (GPU_ONLY, 3, 10, 0, 1),
        ("generator", 1, 4, 1, 4), (GPU_ONLY, 5, 10, 1, 1), (GPU_ONLY, 6, 10, 1, 1), (GPU_ONLY, 7, 10, 1, 1),
        ("trainer", 2, 4, 0, 1), ("trainer", 3, 4, 1, 1)]
    assert [t.local_rank for t in got] == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1] and got[0].master_addr == "gpu01"
    # processes spawned on one machine are numbered by process; their first GPUs skip the generators' others
    spawned = detect(2, 2, local_task_env(1, 4, port=1), gpus_per_generator=4)
    assert (spawned.role, spawned.rank, spawned.gpus) == ("generator", 1, 4)
    assert [first_gpu(r, 2, 4) for r in range(4)] == [0, 4, 8, 9]
    env = {"CUDA_VISIBLE_DEVICES": "3,4,5,6,7,8,9,10"}
    assert pin_gpus(got[4], env) == "7,8,9,10" == env["CUDA_VISIBLE_DEVICES"]
    with pytest.raises(UserError, match="needs GPUs 4..7 of its node, which has 2"):
        pin_gpus(got[4], {"CUDA_VISIBLE_DEVICES": "0,1"})
