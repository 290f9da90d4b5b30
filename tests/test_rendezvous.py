"""The rendezvous of a Slurm job's tasks: two jobs on one node whose ids are equal modulo 20000
prefer the same port, and still each meets in a store of its own (real TCPStores on this
machine, tasks as threads with the environment Slurm gives them)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from scalectl.rl.transport.roles import (
    RENDEZVOUS_ENV, detect, read_port, rendezvous_file, rendezvous_store, slurm_port,
)


def _task(job_id: int, rank: int, world: int, folder, restart: int = 0):
    return detect(1, world - 1, {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world), "SLURM_LOCALID": str(rank),
                                 "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NODELIST": "localhost",
                                 "SLURM_RESTART_COUNT": str(restart), RENDEZVOUS_ENV: str(folder)})


def _start_job(pool, job_id: int, world: int, folder):
    """Every task of job ``job_id`` joins its rendezvous; task 0 then writes the job's id in
    the store and every other task reads it back from the store it joined."""
    def task(rank):
        store = rendezvous_store(_task(job_id, rank, world, folder), timeout_s=60)
        if rank == 0:
            store.set("whose", str(job_id))
        return store

    stores = list(pool.map(task, range(world)))
    return stores, [stores[r].get("whose").decode() for r in range(world)]


def test_two_jobs_whose_ids_collide_mod_20000_meet_in_their_own_stores(tmp_path):
    first, second = 123, 20123
    assert slurm_port(first) == slurm_port(second) == 20123
    with ThreadPoolExecutor(6) as pool:
        stores_a, seen_a = _start_job(pool, first, 3, tmp_path)   # job A holds its store while B starts
        stores_b, seen_b = _start_job(pool, second, 3, tmp_path)
    assert seen_a == [str(first)] * 3 and seen_b == [str(second)] * 3
    a = json.loads(rendezvous_file(tmp_path, str(first)).read_text())
    b = json.loads(rendezvous_file(tmp_path, str(second)).read_text())
    assert a["port"] == stores_a[0].port and b["port"] == stores_b[0].port != a["port"]
    assert a["port"] in b["busy"]                       # B tried the port A holds, and moved on
    assert b["port"] == 20123 + len(b["busy"]) and b["busy"] == list(range(20123, b["port"]))


def test_a_requeued_job_meets_on_a_file_of_its_own_and_a_missing_task_0_times_out(tmp_path):
    assert rendezvous_file(tmp_path, "77", 1) != rendezvous_file(tmp_path, "77", 0)
    assert _task(77, 1, 2, tmp_path, restart=1).rendezvous == str(tmp_path / "rendezvous-77-1.json")
    with pytest.raises(TimeoutError, match="task 0 did not publish the rendezvous port in .*rendezvous-77-1.json"):
        read_port(rendezvous_file(tmp_path, "77", 1), timeout_s=0.3)


def test_the_launcher_sets_the_folder_the_tasks_read():
    from scalectl.launch import slurm
    from scalectl.rl.transport import roles

    assert slurm.RENDEZVOUS_ENV == roles.RENDEZVOUS_ENV
