"""Runs on a real multi-node Slurm cluster: slurmd nodes c1..c3, each in its own network
namespace with its own host name and address (scripts/slurm-cluster.sh), so that a job's
tasks on two nodes talk only over that network, and the SQLite store is never written by a
job: they journal their runs and the commands on this host take the journals in.

The cluster is used if it is up; started (and stopped afterwards) if this process is root;
otherwise, or where network namespaces cannot be made, these tests are skipped with the reason.
"""

from __future__ import annotations

import hashlib
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

from conftest import ROOT, run_cli
from scalectl.job.layout import role_map

pytestmark = pytest.mark.slurm_cluster

TERMINAL_WORDS = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> str:
    """A freshly initialised tiny policy (no warm start: these tests are about launching)."""
    from scalectl.rl.policy.model import build_tiny_model, build_tokenizer, save_policy

    return str(save_policy(build_tiny_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("policy") / "tiny"))


@pytest.fixture
def on_cluster(slurm_cluster, monkeypatch):
    """$SLURM_CONF of the namespace cluster, for this process (submitit) and the commands it runs;
    every job a test submits is cancelled at its end if still there."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster)
    before = set(_squeue())
    yield {"SLURM_CONF": slurm_cluster}
    left = [j for j in _squeue() if j not in before]
    if left:
        subprocess.run(["scancel", *left], capture_output=True)


def _squeue() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True).stdout
    return out.split()


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _scontrol(job_id) -> dict:
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True).stdout
    return dict(t.split("=", 1) for t in out.split() if "=" in t)


def _ended(job_id) -> str:
    return _wait(lambda: (s := _scontrol(job_id).get("JobState", "")) in TERMINAL_WORDS and s, 600,
                 f"Slurm job {job_id} to end")


def _hostnames(nodelist: str) -> list[str]:
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                          check=True).stdout.split()


def _digest(db: Path) -> str:
    """The bytes of the store's file and its WAL: unchanged means nobody wrote the store."""
    h = hashlib.sha256()
    for path in (db, Path(f"{db}-wal")):
        h.update(path.read_bytes() if path.exists() else b"-")
    return h.hexdigest()


def _points(db, name) -> list[dict]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(
            "SELECT p.* FROM eval_points p JOIN runs r ON r.id = p.run_id WHERE r.name = ? ORDER BY step", [name])]


def _status(db, env, name=None):
    rows = {r["name"]: r for r in json.loads(run_cli("status", "--json", db=db, env=env, check=True).stdout)}
    return rows if name is None else rows[name]


TASK_LINE = re.compile(r"Slurm job (\S+) task (\d+)/(\d+) on (\S+) \(node (\d+) of (\S+)\)")


def _placement(job: dict, tasks: int) -> dict[int, tuple[str, int]]:
    """task -> (host name, node index) as each task wrote it in its log."""
    log0 = Path(job["log"])
    out = {}
    for t in range(tasks):
        m = TASK_LINE.search(log0.with_name(f"{job['job_id']}_{t}_log.out").read_text())
        assert m and int(m.group(2)) == t, f"no task line in the log of task {t}"
        out[t] = (m.group(4), int(m.group(5)))
    return out


def _submit(tmp_path, policy, env, name, *args) -> dict:
    proc = run_cli("run", "recipes/scalerl.toml", "--launcher", "slurm", "--json", "--name", name, "--new-run",
                   "--runs-dir", str(tmp_path / "runs"), "--set", f"model.path={policy}", *args,
                   db=tmp_path / "s.db", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _submit_here(tmp_path, policy, name, sets: list[str]) -> dict:
    """Create and submit a run as `scalectl run --launcher slurm` does after its checks
    (:func:`scalectl.launch.runs.create_run`, :func:`~scalectl.launch.runs.submit`), in this
    process: the command would import torch again only to submit (10-15 s on a busy machine)."""
    from scalectl.launch.base import RunSpec
    from scalectl.launch.runs import create_run, submit
    from scalectl.recipe.load import load
    from scalectl.store.database import Store

    recipe = load(ROOT / "recipes/scalerl.toml", ROOT / "setups/tiny-cpu.toml",
                  [f"model.path={policy}"] + [a for a in sets if a != "--set"])
    with Store.open(tmp_path / "s.db") as store:
        run_id, run_dir = create_run(store, recipe, name, tmp_path / "runs", launcher="slurm")
        job = submit(store, [RunSpec(run_id, name, run_dir, recipe)], "slurm")[0]
    return {"run": name, "job_id": job.job_id, "run_dir": str(run_dir), "log": job.log}


def _pipeline(generators: int, trainers: int, nodes: int, steps: int, k: int = 1, every: int | None = None) -> list[str]:
    """--set arguments of a small pipeline run: points (and checkpoints) at step 0 and every
    ``every`` steps (default: at the end)."""
    sets = {"async.mode": "pipeline", "async.k": k, "hardware.generators": generators, "hardware.trainers": trainers,
            "launcher.slurm.nodes": nodes, "launcher.slurm.tasks_per_node": (generators + trainers) // nodes,
            "launcher.slurm.cpus_per_task": 1, "batch.prompts_per_step": 4, "batch.generations_per_prompt": 4,
            "eval.prompts": 8, "eval.samples_per_prompt": 2, "eval.every_steps": every or steps,
            "checkpoint.every_steps": every or steps, "data.train_size": 100, "filter.zero_variance": "false",
            "budget.steps": steps, "logging.rollouts": "true", "hardware.threads": 1,
            "budget.no_signal_steps": 0}    # an untrained policy (every reward -1) runs until its budget or a cancel
    return [a for key, value in sets.items() for a in ("--set", f"{key}={value}")]


def _check_placed_as_the_role_map(job: dict, generators: int, trainers: int, tasks_per_node: int) -> list[str]:
    """Each task ran on the node Slurm gave it, the one the dry run's role map puts it on;
    returns the job's hosts (node 0 first)."""
    info = _scontrol(job["job_id"])
    hosts = _hostnames(info["NodeList"])
    placed = _placement(job, generators + trainers)
    for slot in role_map(generators, trainers, tasks_per_node):
        assert placed[slot.rank] == (hosts[slot.node], slot.node), (slot, placed)
    rendezvous = json.loads((Path(job["log"]).parent / f"rendezvous-{job['job_id']}-0.json").read_text())
    assert rendezvous["host"] == hosts[0]                 # task 0 hosts the store on the first node
    return hosts


def _check_trained_across(run_dir: Path, steps: int, k: int, leader_log: Path, leader_host: str) -> None:
    """Every trained token at most k versions old, tokens of versions > 0 sampled (the weights
    came over from the trainer's node), and the run journaled from its node."""
    lines = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert {line["step"] for line in lines} == set(range(steps))
    assert max(line["step"] - v for line in lines for v in line["versions"]) <= k
    assert max(v for line in lines for v in line["versions"]) >= steps - 1 - k >= 1
    text = leader_log.read_text()
    assert "store: journal mode" in text
    assert f"this job runs on {leader_host}, the store belongs to {socket.gethostname()}" in text


def test_a_pipeline_across_two_nodes_lands_its_points(on_cluster, policy, tmp_path):
    """1 generator + 1 trainer as one job on 2 nodes: the generator on the first node hosts the
    rendezvous, the trainer on the second trains and pushes its weights over the bridge.  The
    points land (through the run's journal: the store's file is not written while the job runs)
    and every task ran where Slurm and the dry run's role map put it."""
    db, steps = tmp_path / "s.db", 3
    job = _submit_here(tmp_path, policy, "across", _pipeline(1, 1, nodes=2, steps=steps))
    before = _digest(db)
    assert _ended(job["job_id"]) == "COMPLETED"
    assert _digest(db) == before                         # the job wrote its journal, not the store
    row = _status(db, on_cluster, "across")              # the command takes the journal in
    assert row["status"] == "completed", row["error"]
    assert [p["step"] for p in _points(db, "across")] == [0, steps]
    hosts = _check_placed_as_the_role_map(job, 1, 1, 1)
    assert hosts == ["c1", "c2"] or len(set(hosts)) == 2
    leader_log = Path(job["log"]).with_name(f"{job['job_id']}_1_log.out")
    _check_trained_across(Path(job["run_dir"]), steps, 1, leader_log, hosts[1])


@pytest.mark.slow
def test_two_plus_two_on_two_nodes_and_a_three_node_layout(on_cluster, policy, tmp_path):
    """A 2 + 2 pipeline as one job of 2 nodes x 2 tasks (generators on one node, the two
    data-parallel trainers on the other) and 2 generators + 1 trainer on 3 nodes, at once."""
    db, steps = tmp_path / "s.db", 4
    jobs = {"two": (_submit(tmp_path, policy, on_cluster, "two", *_pipeline(2, 2, nodes=2, steps=steps)), 2, 2, 2),
            "three": (_submit(tmp_path, policy, on_cluster, "three", *_pipeline(2, 1, nodes=3, steps=steps)), 2, 1, 1)}
    for name, (job, *_) in jobs.items():
        assert _ended(job["job_id"]) == "COMPLETED", name
    rows = _status(db, on_cluster)
    for name, (job, generators, trainers, per_node) in jobs.items():
        assert rows[name]["status"] == "completed", rows[name]["error"]
        assert [p["step"] for p in _points(db, name)] == [0, steps]
        hosts = _check_placed_as_the_role_map(job, generators, trainers, per_node)
        assert len(set(hosts)) == len(hosts) == (2 if name == "two" else 3)
        leader = generators
        leader_log = Path(job["log"]).with_name(f"{job['job_id']}_{leader}_log.out")
        _check_trained_across(Path(job["run_dir"]), steps, 1, leader_log,
                              hosts[role_map(generators, trainers, per_node)[leader].node])
    follower = Path(jobs["two"][0]["log"]).with_name(f"{jobs['two'][0]['job_id']}_3_log.out")
    assert f"trainer rank 1 followed {steps} step(s)" in follower.read_text()


@pytest.mark.slow
def test_two_jobs_on_the_same_nodes_whose_ports_collide_each_meet_in_their_own_store(on_cluster, policy, tmp_path):
    """Two jobs on c1 + c2 at once that prefer the same rendezvous port (as jobs whose ids are
    equal modulo 20000 do: SCALECTL_MASTER_PORT gives both the same): the second takes the next
    free port on c1, and both train."""
    db, port = tmp_path / "s.db", 24321
    env = dict(on_cluster, SCALECTL_MASTER_PORT=str(port))
    where = ["--set", 'launcher.slurm.additional_parameters={nodelist = "c1,c2"}']
    first = _submit(tmp_path, policy, env, "holder", *_pipeline(1, 1, nodes=2, steps=1_000_000, every=1000), *where)
    folder = Path(first["log"]).parent
    held = _wait(lambda: (f := folder / f"rendezvous-{first['job_id']}-0.json").exists() and json.loads(f.read_text()),
                 300, "the first job's rendezvous")
    second = _submit(tmp_path, policy, env, "second", *_pipeline(1, 1, nodes=2, steps=2), *where)
    assert _ended(second["job_id"]) == "COMPLETED"
    assert _scontrol(first["job_id"])["JobState"] == "RUNNING"          # it held its port all along
    moved = json.loads((Path(second["log"]).parent / f"rendezvous-{second['job_id']}-0.json").read_text())
    assert held["port"] == port and held["busy"] == []
    assert moved["busy"] == [port] and moved["port"] == port + 1 and moved["host"] == held["host"] == "c1"
    assert f"rendezvous: port(s) {port} in use on c1; took {port + 1}" in Path(second["log"]).read_text()
    assert _status(db, env, "second")["status"] == "completed"
    assert [p["step"] for p in _points(db, "second")] == [0, 2]
    assert _scontrol(first["job_id"])["NodeList"] == _scontrol(second["job_id"])["NodeList"] == "c[1-2]"
    run_cli("cancel", "holder", db=db, env=env, check=True, timeout=300)
    assert _status(db, env, "holder")["status"] == "cancelled"


def _sacct(job_id: str) -> list[dict]:
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State,NodeList,Start,End"],
                         capture_output=True, text=True, check=True).stdout
    keys = ("job_id", "state", "nodes", "start", "end")
    return [dict(zip(keys, line.split("|"))) for line in out.strip().splitlines()]


@pytest.mark.slow
def test_a_job_array_of_three_runs_across_the_nodes(on_cluster, policy, tmp_path):
    """Three runs as one job array (an ablation's launch) with launcher.max_parallel = 2: each
    runs on the node Slurm gives it and says so, never more than two at once (sacct's start
    and end times), and every one lands its points through its journal."""
    from scalectl.job.body import write_job_file
    from scalectl.launch.base import RunSpec
    from scalectl.launch.slurm import SlurmLauncher
    from scalectl.recipe.load import load
    from scalectl.store.database import Store

    db = tmp_path / "s.db"
    overrides = ["async.mode=sync", "batch.prompts_per_step=4", "batch.generations_per_prompt=4", "eval.every_steps=2",
                 "eval.prompts=8", "eval.samples_per_prompt=2", "checkpoint.every_steps=2", f"model.path={policy}",
                 "budget.steps=4", "launcher.max_parallel=2", "hardware.threads=1",
                 "launcher.slurm.cpus_per_task=2"]     # a node's 2 CPUs each: two at once land on two nodes
    specs, names = [], ["a0", "a1", "a2"]
    with Store.open(db) as store:
        for seed, name in enumerate(names):
            recipe = load(ROOT / "recipes/grpo.toml", ROOT / "setups/tiny-cpu.toml", overrides + [f"seed={seed}"])
            run_dir = tmp_path / "runs" / name
            run_id = store.create_run(name, recipe=recipe.to_dict(), recipe_hash=recipe.content_hash, seed=seed,
                                      launcher="slurm", run_dir=str(run_dir), status="pending")
            write_job_file(run_dir, db=store.path, run_id=run_id, recipe=recipe.to_dict())
            specs.append(RunSpec(run_id, name, run_dir, recipe))
        jobs = SlurmLauncher().submit_many(specs, job_name="array")
        for spec, job in zip(specs, jobs):
            store.add_job_id(spec.run_id, job.job_id)
    array = jobs[0].job_id.split("_")[0]
    assert "#SBATCH --array=0-2%2" in (Path(jobs[0].info["folder"]) / f"{array}_submission.sh").read_text()
    for job in jobs:                           # the controller's word first: accounting may lag behind it
        assert _ended(job.job_id) == "COMPLETED", job.job_id
    _wait(lambda: all(r["state"] in TERMINAL_WORDS for r in _sacct(array)) and len(_sacct(array)) == 3, 600,
          "the array's three runs to end")
    acct = {r["job_id"]: r for r in _sacct(array)}
    rows = _status(db, on_cluster)
    for name, job in zip(names, jobs):
        assert acct[job.job_id]["state"] == "COMPLETED" and rows[name]["status"] == "completed", rows[name]["error"]
        assert [p["step"] for p in _points(db, name)] == [0, 2, 4]
        host = TASK_LINE.search(Path(job.log).read_text()).group(4)
        assert host == acct[job.job_id]["nodes"], (name, host, acct[job.job_id])
    spans = [(datetime.fromisoformat(r["start"]), datetime.fromisoformat(r["end"])) for r in acct.values()]
    most = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert most <= 2
    assert len({r["nodes"] for r in acct.values()}) >= 2, acct      # they ran on more than one node


def _task_pids(job_id: str) -> dict[int, int]:
    """SLURM_PROCID -> pid of each Python task of a running job (not srun, not the batch shell),
    found in /proc: `scontrol listpids` answers only on the job's own node."""
    out = {}
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"submitit.core._submit" not in argv or not Path(argv[0].decode()).name.startswith("python"):
                continue
            env = dict(v.split(b"=", 1) for v in (proc / "environ").read_bytes().split(b"\0") if b"=" in v)
        except (OSError, ValueError):
            continue
        if env.get(b"SLURM_JOB_ID") == job_id.encode() and b"SLURM_PROCID" in env:
            out[int(env[b"SLURM_PROCID"])] = int(proc.name)
    return out


SIMULATED = "simulated:A=0.6,B=2,C_mid=0.1,R0=0.3,hours_per_step=0.001,seconds_per_step=0.2"


@pytest.mark.slow
def test_two_runs_on_two_nodes_reach_the_store_through_journals_and_a_kill_loses_no_point(on_cluster, tmp_path):
    """Two simulated runs at once, on c2 and on c3: the store's file is not written while they
    run; the commands take their journals in.  One job is killed -9 in the middle of its run:
    every point its journal holds whole is stored, once (a second reading adds nothing)."""
    db = tmp_path / "s.db"
    jobs = {}
    for name, node, steps in (("kept", "c2", 20), ("killed", "c3", 100_000)):
        proc = run_cli("run", "recipes/grpo.toml", "--setup", "setups/simulated.toml", "--launcher", "slurm",
                       "--json", "--name", name, "--runs-dir", str(tmp_path / "runs"),
                       "--set", f"model.path={SIMULATED}", "--set", "eval.every_steps=1",
                       "--set", f"budget.steps={steps}", "--set", f"launcher.slurm.additional_parameters={{nodelist = \"{node}\"}}",
                       db=db, env=on_cluster)
        assert proc.returncode == 0, proc.stderr
        jobs[name] = json.loads(proc.stdout)
    before = _digest(db)
    from scalectl.store.journal import journal_files, read_records

    run_dir = Path(jobs["killed"]["run_dir"])
    _wait(lambda: journal_files(run_dir) and len(read_records(journal_files(run_dir)[0])[0]) >= 30, 300,
          "30 records in the journal of the run to kill")
    task = _task_pids(jobs["killed"]["job_id"])
    assert list(task) == [0]
    os.kill(task[0], signal.SIGKILL)
    assert _ended(jobs["kept"]["job_id"]) == "COMPLETED" and _ended(jobs["killed"]["job_id"]) == "FAILED"
    assert _digest(db) == before                         # neither job wrote the store
    journaled = sorted({r["point"]["step"] for f in journal_files(run_dir) for r in read_records(f)[0]
                        if r["kind"] == "point"})
    rows = _status(db, on_cluster)
    assert rows["kept"]["status"] == "completed" and rows["killed"]["status"] == "failed"
    assert [p["step"] for p in _points(db, "kept")] == list(range(21))
    assert [p["step"] for p in _points(db, "killed")] == journaled == list(range(len(journaled)))
    again = {r["name"]: r for r in json.loads(run_cli("runs", "--json", db=db, env=on_cluster, check=True).stdout)}
    assert (again["kept"]["n_points"], again["killed"]["n_points"]) == (21, len(journaled))   # nothing doubled
    for name, node in (("kept", "c2"), ("killed", "c3")):
        log = Path(jobs[name]["log"]).read_text()
        assert f" on {node} (node 0 of {node})" in log and "store: journal mode" in log


RUN_DIR = Path("/run/slurm-cluster")


def _netns_pids(node: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", f"sc-{node}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _kill_node(node: str) -> list[int]:
    """SIGKILL every process of ``node``: its slurmd, its slurmstepd and the job's tasks there
    (everything in its network namespace), as a node that loses power."""
    pids = _netns_pids(node)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def _revive_node(node: str, conf: str) -> None:
    """Start ``node``'s slurmd again in its namespace, as scripts/slurm-cluster.sh start does for a
    node that is not running, and wait until it takes jobs."""
    if not Path(f"/proc/{(RUN_DIR / f'slurmd-{node}.pid').read_text().strip()}").exists():
        subprocess.run(["nsenter", f"--net=/run/netns/sc-{node}", "unshare", "--uts", "sh", "-c",
                        f"hostname {node}; SLURM_CONF={conf} exec slurmd -f {conf} -N {node}"], check=True, timeout=60)

    def up():
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
        state = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True).stdout
        return state.strip() in ("idle", "mixed", "allocated")
    _wait(up, 180, f"node {node} to take jobs again")


@pytest.mark.slow
def test_a_node_that_dies_fails_the_run_naming_it_and_resume_completes_on_the_others(on_cluster, policy, tmp_path):
    """A 1 + 1 pipeline on 2 nodes; every process of the trainer's node (slurmd, slurmstepd, the
    task) is killed after the first checkpoint.  The generator on the other node names the lost
    task and its node, records the run failed and ends the job (scancel), so that no process of
    the job is left on the node that lives; `scalectl run --resume` then completes the run on
    the nodes that remain."""
    db = tmp_path / "s.db"
    others = _squeue()
    assert not others, f"the cluster runs other jobs ({others}): killing a node would kill them"
    job = _submit(tmp_path, policy, on_cluster, "dies", *_pipeline(1, 1, nodes=2, steps=1_000_000, every=2))
    run_dir = Path(job["run_dir"])
    _wait(lambda: (run_dir / "checkpoints" / "latest").exists(), 600, "the first checkpoint")
    hosts = _hostnames(_scontrol(job["job_id"])["NodeList"])
    pids = _task_pids(job["job_id"])
    assert sorted(pids) == [0, 1]
    victim = hosts[1]                                     # task 1, the first trainer rank, runs there
    every = [p for p in pids.values()]
    try:
        t0 = time.monotonic()
        killed = _kill_node(victim)
        assert pids[1] in killed
        row = _wait(lambda: (r := _status(db, on_cluster, "dies"))["status"] != "running" and r, 600,
                    "the run to be recorded as ended")
        took = time.monotonic() - t0
        log1 = Path(job["log"]).with_name(f"{job['job_id']}_1_log.out")
        assert row["status"] == "failed", row
        assert (f"TaskLost: trainer task 1 (trainer rank 0, pid {pids[1]} on {victim}) stopped answering"
                in row["error"]) and str(log1) in row["error"], row["error"]
        state = _ended(job["job_id"])
        ended = time.monotonic() - t0
        assert state in ("CANCELLED", "FAILED", "NODE_FAIL"), state
        _wait(lambda: not [p for p in every if Path(f"/proc/{p}").exists()] and not _task_pids(job["job_id"]), 120,
              "every task of the job to be gone")
        log0 = Path(job["log"]).read_text()
        assert f"ending Slurm job {job['job_id']}: trainer task 1 (trainer rank 0, pid {pids[1]} on {victim})" in log0
        print(f"node {victim} killed: run failed after {took:.1f} s, job {state} after {ended:.1f} s")
        from scalectl.rl.checkpoint import latest_checkpoint

        stopped = int(latest_checkpoint(run_dir).name.split("-")[1])
        resumed = run_cli("run", "--resume", "dies", "--runs-dir", str(tmp_path / "runs"), "--json",
                          "--set", f"budget.steps={stopped + 2}", db=db, env=on_cluster)
        assert resumed.returncode == 0, resumed.stderr
        again = json.loads(resumed.stdout)
        assert _ended(again["job_id"]) == "COMPLETED"
        row = _status(db, on_cluster, "dies")
        assert row["status"] == "completed", row["error"]
        assert victim not in _hostnames(_scontrol(again["job_id"])["NodeList"])    # the nodes that remain
        assert [p["step"] for p in _points(db, "dies")][-1] == stopped + 2
    finally:
        _revive_node(victim, on_cluster["SLURM_CONF"])


@pytest.mark.slow
def test_generators_and_trainers_on_node_sets_of_their_own(on_cluster, policy, tmp_path):
    """2 generators + 1 trainer with launcher.slurm.generator_nodes = 2 and trainer_nodelist = c1:
    the trainer runs on c1 and the generators on c2 and c3, each task where the batch script's host
    file put it (its own log says so), the rendezvous on task 0's host c2 (not the job's first
    node, c1), and the run lands its points."""
    db, steps = tmp_path / "s.db", 3
    sets = _pipeline(2, 1, nodes=3, steps=steps) + ["--set", "launcher.slurm.generator_nodes=2",
                                                    "--set", "launcher.slurm.trainer_nodelist=c1"]
    job = _submit(tmp_path, policy, on_cluster, "roles", *sets)
    assert _ended(job["job_id"]) == "COMPLETED"
    row = _status(db, on_cluster, "roles")
    assert row["status"] == "completed", row["error"]
    assert [p["step"] for p in _points(db, "roles")] == [0, steps]
    assert _hostnames(_scontrol(job["job_id"])["NodeList"]) == ["c1", "c2", "c3"]
    placed = _placement(job, 3)
    assert [placed[t][0] for t in range(3)] == ["c2", "c3", "c1"]
    hosts = (Path(job["log"]).parent / f"hosts-{job['job_id']}-0").read_text().split()
    assert hosts == ["c2", "c3", "c1"]
    rendezvous = json.loads((Path(job["log"]).parent / f"rendezvous-{job['job_id']}-0.json").read_text())
    assert rendezvous["host"] == "c2"
    leader_log = Path(job["log"]).with_name(f"{job['job_id']}_2_log.out")
    _check_trained_across(Path(job["run_dir"]), steps, 1, leader_log, "c1")


@pytest.mark.slow
def test_a_generator_that_hangs_on_one_node_fails_the_run_and_ends_the_job(on_cluster, policy, tmp_path):
    """A 1 + 1 pipeline on 2 nodes whose generator stops its loop after its second message, its
    process and heartbeat alive (SCALECTL_TEST_STALL_GENERATOR, passed on by sbatch): the trainer
    on the other node records the run failed naming the generator and its host once
    launcher.stall_timeout_s passes without progress, and cancels the job, so that the stuck
    task does not hold the allocation; no task of the job is left."""
    from scalectl.rl.processes.bodies import STALL_ENV

    db = tmp_path / "s.db"
    env = dict(on_cluster, **{STALL_ENV: "0:2"})
    job = _submit(tmp_path, policy, env, "hangs", *_pipeline(1, 1, nodes=2, steps=1_000_000, every=1000),
                  "--set", "launcher.stall_timeout_s=15")
    _wait(lambda: sorted(_task_pids(job["job_id"])) == [0, 1] and _task_pids(job["job_id"]), 600, "both tasks")
    pids = _task_pids(job["job_id"])
    state = _ended(job["job_id"])
    assert state == "CANCELLED", state
    hosts = _hostnames(_scontrol(job["job_id"])["NodeList"])
    row = _status(db, on_cluster, "hangs")
    log0 = Path(job["log"])
    assert row["status"] == "failed", row
    assert (f"TaskStuck: generator task 0 (generator rank 0, pid {pids[0]} on {hosts[0]}) made no progress for "
            in row["error"]) and f"(limit 15 s, launcher.stall_timeout_s) (log: {log0})" in row["error"], row["error"]
    assert f"{STALL_ENV}: generator rank 0 stops its loop after 2 message(s)" in log0.read_text()
    _wait(lambda: not [p for p in pids.values() if Path(f"/proc/{p}").exists()], 120, "every task to be gone")


@pytest.mark.slow
@pytest.mark.parametrize("stopped", [1, 0], ids=["a-generator", "the-store-host"])
def test_a_stopped_generator_on_one_node_fails_the_run_within_the_limit_and_ends_the_job(on_cluster, policy, tmp_path,
                                                                                         stopped):
    """A 2 + 1 pipeline on 3 nodes; once the run has stored its first point, generator task
    ``stopped`` is stopped (``kill -STOP``: its process, heartbeat and sockets frozen, its
    connections open), task 1 or task 0, the host of the job's store.  The trainer, whatever it
    was waiting on (a send to it, its rollouts, a weight push), records the run failed naming the
    task, its pid and node and what was seen, within launcher.stall_timeout_s of the stop, and
    cancels the job; no task of the job is left."""
    db = tmp_path / "s.db"
    job = _submit(tmp_path, policy, on_cluster, "frozen", *_pipeline(2, 1, nodes=3, steps=1_000_000, every=2),
                  "--set", "launcher.stall_timeout_s=15")
    run_dir = Path(job["run_dir"])
    _wait(lambda: (run_dir / "checkpoints" / "latest").exists(), 600, "the first checkpoint")
    pids = _task_pids(job["job_id"])
    assert sorted(pids) == [0, 1, 2]
    hosts = _hostnames(_scontrol(job["job_id"])["NodeList"])
    t0 = time.monotonic()
    os.kill(pids[stopped], signal.SIGSTOP)
    state = _ended(job["job_id"])
    took = time.monotonic() - t0
    assert state == "CANCELLED", state
    row = _status(db, on_cluster, "frozen")
    print(f"generator task {stopped} stopped on {hosts[stopped]}: job {state} {took:.1f} s later, "
          f"load {os.getloadavg()[0]:.1f}")
    assert row["status"] == "failed", row
    seen = ("the job's store, which it hosts, did not answer for " if stopped == 0 else
            "its heartbeat stood still for ")
    named = f"TaskLost: generator task {stopped} (generator rank {stopped}, pid {pids[stopped]} on {hosts[stopped]})"
    assert f"{named} stopped answering ({seen}" in row["error"], row["error"]
    assert "limit 15 s, launcher.stall_timeout_s: its process is stopped or its node cut off)" in row["error"]
    leader_log = Path(job["log"]).with_name(f"{job['job_id']}_2_log.out").read_text()
    assert f"ending Slurm job {job['job_id']}: {named.removeprefix('TaskLost: ')}" in leader_log
    _wait(lambda: not [p for p in pids.values() if Path(f"/proc/{p}").exists()], 120, "every task to be gone")
