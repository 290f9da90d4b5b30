"""Who am I in a multi-task job: role (generator or trainer), rank, and the rendezvous.

A run holds ``hardware.generators + hardware.trainers`` devices, one task
each: global ranks ``0 .. generators-1`` generate rollouts, the rest train
(ScaleRL's split of 64 vLLM generators and 16 DeepSpeed trainers, Khatri et
al. 2025, section 3).  A task reads its rank from

* Slurm (``srun``): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``;
  the rendezvous host (``MASTER_ADDR``) is the first node of
  ``SLURM_JOB_NODELIST``, where task 0 runs (``$SCALECTL_MASTER_ADDR`` when the job
  places its tasks by role and task 0 runs elsewhere).  The port task 0 tries first is
  derived from the job id (:func:`slurm_port`; ``SCALECTL_MASTER_PORT`` sets
  it); when the launcher names a folder that every task of the job sees
  (``$SCALECTL_RENDEZVOUS_DIR``, the job's submitit folder), task 0 takes the
  next free port if that one is in use on its node (another job there, whose
  id is the same modulo 20000, or any other program) and publishes the port it
  took in a file there, which the other tasks read (:func:`rendezvous_store`),
  so two jobs on one node never meet in one store;
* a local spawn or torchrun: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT`` (:func:`local_task_env` builds them);
* nothing: a single task, rank 0 of 1.

:func:`init_process_group` then joins torch.distributed: NCCL on GPUs,
gloo on CPUs.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from scalectl.errors import UserError

ROLES = ("generator", "trainer")
#: The environment variable naming a folder shared by every task of a job (the launcher sets it),
#: where task 0 publishes the rendezvous port it took.
RENDEZVOUS_ENV = "SCALECTL_RENDEZVOUS_DIR"
#: Task 0's host when it is not the first of the job's nodes (a job placed by role, whose batch
#: script exports it: :mod:`scalectl.launch.placement`).
MASTER_ADDR_ENV = "SCALECTL_MASTER_ADDR"
#: Ports task 0 tries after the preferred one (then any port the kernel gives).
PORT_TRIES = 32
_JOINED = "scalectl/rendezvous/joined"
_ALL_JOINED = "scalectl/rendezvous/all-joined"


@dataclass(frozen=True)
class Task:
    """One task of a job.

    Attributes:
        role: ``generator`` or ``trainer``.
        rank: global rank, 0 .. world_size-1.
        world_size: tasks in the job.
        local_rank: rank on this node (selects the GPU).
        role_rank: rank among the tasks of the same role.
        role_size: tasks with this role.
        master_addr, master_port: the torch.distributed rendezvous (with a ``rendezvous``
            file, the port task 0 tries first).
        source: where the numbers came from: ``slurm``, ``env`` or ``single``.
        rendezvous: the file where task 0 publishes the port it took ('' : the port is
            ``master_port``, fixed).
    """

    role: str
    rank: int
    world_size: int
    local_rank: int
    role_rank: int
    role_size: int
    master_addr: str
    master_port: int
    source: str
    rendezvous: str = ""


def assign_role(rank: int, generators: int, trainers: int) -> tuple[str, int, int]:
    """(role, rank within the role, tasks with that role) of global ``rank``:
    the first ``generators`` ranks generate, the next ``trainers`` train.

    Raises:
        ValueError: rank outside 0 .. generators + trainers - 1.
    """
    if not 0 <= rank < generators + trainers:
        raise ValueError(f"rank {rank} outside 0..{generators + trainers - 1} "
                         f"({generators} generators + {trainers} trainers)")
    if rank < generators:
        return "generator", rank, generators
    return "trainer", rank - generators, trainers


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``node[003-005,9],gpu1`` -> ``node003``.

    Raises:
        ValueError: an empty or malformed list.
    """
    text = nodelist.strip()
    m = re.match(r"^([^,\[]+)(?:\[([^\]]+)\])?", text)
    if not text or not m:
        raise ValueError(f"cannot read a host from node list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    if not first.isdigit():
        raise ValueError(f"cannot read a host from node list {nodelist!r}")
    return prefix + first


def slurm_port(job_id: str | int) -> int:
    """The rendezvous port a Slurm job tries first: 20000 + (job id mod 20000).  Two jobs on
    one node whose ids are equal modulo 20000 prefer the same port; :func:`rendezvous_store`
    moves the second to a free one."""
    return 20000 + int(str(job_id).split("_")[0]) % 20000


def rendezvous_file(folder: str | Path, job_id: str, restart: str | int = 0) -> Path:
    """Where task 0 of Slurm job ``job_id`` (its own id, ``SLURM_JOB_ID``) publishes its
    rendezvous port, in its ``restart``-th start (``SLURM_RESTART_COUNT``: a requeued job
    keeps its id and meets again on a new port)."""
    return Path(folder) / f"rendezvous-{job_id}-{restart}.json"


def detect(generators: int = 1, trainers: int = 1, env: dict | None = None, *, strict: bool = True) -> Task:
    """This process's task, from Slurm's or torchrun-style environment variables.

    Args:
        generators, trainers: the run's ``hardware`` counts.
        env: the environment (default ``os.environ``).
        strict: require world size == generators + trainers when there is
            more than one task; when False, a mismatch names every rank
            beyond the generators a trainer.

    Raises:
        UserError: the job's task count does not match the hardware section.
    """
    env = os.environ if env is None else env
    rendezvous = ""
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world, local = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0))
        nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "localhost"
        addr = env.get(MASTER_ADDR_ENV) or first_host(nodes)     # placement by role: task 0's host
        port = int(env.get("SCALECTL_MASTER_PORT") or slurm_port(env.get("SLURM_JOB_ID", "0")))
        source = "slurm"
        if env.get(RENDEZVOUS_ENV):
            rendezvous = str(rendezvous_file(env[RENDEZVOUS_ENV], env.get("SLURM_JOB_ID", "0"),
                                             env.get("SLURM_RESTART_COUNT", "0")))
    elif "RANK" in env and "WORLD_SIZE" in env:
        rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0))
        addr, port, source = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", 29500)), "env"
    else:
        rank, world, local, addr, port, source = 0, 1, 0, "127.0.0.1", int(env.get("MASTER_PORT", 29500)), "single"
    if world > 1 and world != generators + trainers:
        if strict:
            raise UserError(f"the job has {world} tasks but hardware asks for {generators} generators + "
                            f"{trainers} trainers = {generators + trainers}: set launcher.slurm.nodes x "
                            "tasks_per_node to match")
        generators = min(generators, world - 1)
        trainers = world - generators
    if world == 1:
        role, role_rank, role_size = "trainer", 0, 1
    else:
        role, role_rank, role_size = assign_role(rank, generators, trainers)
    return Task(role, rank, world, local, role_rank, role_size, addr, port, source, rendezvous)


def local_task_env(rank: int, world_size: int, port: int, addr: str = "127.0.0.1",
                   local_rank: int | None = None) -> dict[str, str]:
    """The torch.distributed environment of task ``rank`` (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; read back by :func:`detect`, and by
    DeepSpeed).  ``local_rank`` defaults to ``rank`` (every task on this machine)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank if local_rank is None else local_rank),
            "MASTER_ADDR": addr, "MASTER_PORT": str(port)}


def free_port() -> int:
    """A TCP port free on this machine right now (for a local rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_use(exc: BaseException) -> bool:
    return "EADDRINUSE" in str(exc) or "address already in use" in str(exc).lower()


def host_store(task: Task, timeout_s: float):
    """Task 0's side of the rendezvous: a ``torch.distributed.TCPStore`` server on the first
    free port among ``task.master_port`` and the :data:`PORT_TRIES` ports after it, else on
    any port the kernel gives.

    Returns:
        (the store, the ports found in use before it, in order).

    Raises:
        torch.distributed.DistNetworkError: a failure other than a port in use.
    """
    import torch.distributed as dist

    first = task.master_port
    candidates = [p for p in range(first, first + PORT_TRIES + 1) if p <= 65535] + [0]
    busy = []
    for port in candidates:
        try:
            store = dist.TCPStore(task.master_addr, port, task.world_size, True,
                                  timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
            return store, busy
        except dist.DistNetworkError as exc:
            if not _in_use(exc) or port == 0:
                raise
            busy.append(port)
    raise AssertionError("unreachable: port 0 either binds or raises")


def publish_port(path: str | Path, port: int, busy: list[int]) -> None:
    """Write ``{"port", "host", "pid", "busy"}`` to ``path`` atomically (a temporary file
    renamed: a reader sees the whole file or none)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"port": port, "host": socket.gethostname(), "pid": os.getpid(), "busy": busy}))
    os.replace(tmp, path)


def read_port(path: str | Path, timeout_s: float, poll_s: float = 0.1) -> int:
    """The port task 0 published in ``path`` (:func:`publish_port`), waiting for it.

    Raises:
        TimeoutError: nothing published within ``timeout_s`` seconds (task 0 did not start,
            or the folder is not shared between the job's nodes).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return int(json.loads(Path(path).read_text())["port"])
        except (FileNotFoundError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"task 0 did not publish the rendezvous port in {path} within "
                                   f"{timeout_s:.0f} s (is its folder shared by every node of the job?)") from None
            time.sleep(poll_s)


def rendezvous_store(task: Task, timeout_s: float = 600.0):
    """The job's rendezvous store (a ``torch.distributed.TCPStore``), hosted by task 0 on
    ``task.master_addr``; every task of the job calls it.

    Without ``task.rendezvous`` the port is ``task.master_port`` for every task (a local
    spawn picks a free one; ``SCALECTL_MASTER_PORT`` fixes one).  With it, task 0 takes a
    free port (:func:`host_store`: the preferred one, or the next free one when another job
    on its node holds it), says so on stderr when it had to move, and publishes it
    (:func:`publish_port`); the other tasks read it there (:func:`read_port`) and connect.
    Task 0 returns once every task has connected.

    Raises:
        TimeoutError: the port was not published, or not every task connected, within
            ``timeout_s`` seconds.
    """
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if not task.rendezvous:
        return dist.TCPStore(task.master_addr, task.master_port, task.world_size, task.rank == 0, timeout=timeout)
    if task.rank != 0:
        port = read_port(task.rendezvous, timeout_s)
        store = dist.TCPStore(task.master_addr, port, task.world_size, False, timeout=timeout,
                              wait_for_workers=False)
        if store.add(_JOINED, 1) == task.world_size - 1:
            store.set(_ALL_JOINED, "1")
        return store
    store, busy = host_store(task, timeout_s)
    if busy:
        print(f"rendezvous: port(s) {', '.join(map(str, busy))} in use on {socket.gethostname()}; "
              f"took {store.port}", file=sys.stderr, flush=True)
    publish_port(task.rendezvous, store.port, busy)
    if task.world_size > 1:
        try:
            store.wait([_ALL_JOINED], timeout)
        except Exception as exc:  # noqa: BLE001 - torch raises its own error types for a timeout
            joined = store.add(_JOINED, 0)
            raise TimeoutError(f"{joined} of the job's {task.world_size - 1} other tasks joined the rendezvous "
                               f"on {task.master_addr}:{store.port} within {timeout_s:.0f} s ({exc})") from None
    return store


def init_process_group(task: Task, device: str = "cpu", timeout_s: float = 300.0) -> str:
    """Join torch.distributed as ``task`` through the job's rendezvous store
    (:func:`rendezvous_store`): NCCL when ``device == "cuda"`` and a
    GPU is present (the task's GPU is ``local_rank``), gloo otherwise.  Also
    exports MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK (DeepSpeed
    reads them).

    Returns:
        The backend: ``nccl`` or ``gloo``.
    """
    import torch
    import torch.distributed as dist

    os.environ.update(local_task_env(task.rank, task.world_size, task.master_port, task.master_addr,
                                     task.local_rank))
    backend = "nccl" if device == "cuda" and torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(task.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, store=rendezvous_store(task, timeout_s),
                                rank=task.rank, world_size=task.world_size,
                                timeout=timedelta(seconds=timeout_s))
    return backend


def exchange_check(generators: int = 1, trainers: int = 1, device: str = "cpu") -> dict:
    """A smoke test of a job's roles and process group, run by every task.

    Trainer 0 sends each generator the tensor ``[1, 2, 3] * (g + 1)`` (g the
    generator's rank); each generator answers with the tensor it received
    times 10 plus its rank.  Run it on a fresh allocation to check that the
    tasks find each other before spending GPU-hours.

    Returns:
        role, rank, world_size, backend, master_addr, and what this task sent
        and received (lists of numbers).
    """
    import torch
    import torch.distributed as dist

    task = detect(generators, trainers)
    backend = init_process_group(task, device)
    sent, received = [], []
    try:
        trainer0 = generators
        if task.role == "trainer" and task.role_rank == 0:
            for g in range(generators):
                x = torch.tensor([1.0, 2.0, 3.0]) * (g + 1)
                dist.send(x, dst=g)
                reply = torch.empty(3)
                dist.recv(reply, src=g)
                sent.append(x.tolist())
                received.append(reply.tolist())
        elif task.role == "generator":
            x = torch.empty(3)
            dist.recv(x, src=trainer0)
            reply = x * 10 + task.rank
            dist.send(reply, dst=trainer0)
            received.append(x.tolist())
            sent.append(reply.tolist())
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return {"role": task.role, "rank": task.rank, "world_size": task.world_size, "backend": backend,
            "master_addr": task.master_addr, "source": task.source, "sent": sent, "received": received}
