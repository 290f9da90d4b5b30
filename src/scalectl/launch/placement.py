"""Placement by role: the host of every task of a Slurm job whose generators and trainers have
nodes of their own (``launcher.slurm.generator_nodes`` > 0).

The job asks for ``nodes`` nodes of ``tasks_per_node`` tasks each (what the busiest node
holds); its batch script, before ``srun``, runs ``python -m scalectl.launch.placement`` (the
script's setup lines, :func:`setup_lines`), which writes one host per task, in rank order, to
``$SLURM_HOSTFILE``; ``srun --distribution=arbitrary --ntasks=G+T`` then starts task r on line
r's host (Slurm's arbitrary distribution), and ``$SCALECTL_MASTER_ADDR`` names task 0's host,
where the rendezvous is (:func:`scalectl.rl.transport.roles.detect`).

Which hosts generate: those of ``generator_nodelist`` when it is set, else the job's first
``generator_nodes`` hosts not named in ``trainer_nodelist``; the trainers take
``trainer_nodelist``'s hosts, else the job's other hosts.  Each role is spread over its hosts
as evenly as it goes (:func:`scalectl.job.layout.role_map`), so a node holds one role only.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from scalectl.job.layout import role_map
from scalectl.names import expand_hostlist

#: Task 0's host, which the tasks read (:data:`scalectl.rl.transport.roles.MASTER_ADDR_ENV`).
MASTER_ADDR_ENV = "SCALECTL_MASTER_ADDR"


class PlacementError(ValueError):
    """The job's nodes cannot hold the roles as the setup asks (a named host not in the job, too
    few nodes)."""


def role_hosts(job_hosts: list[str], generator_nodes: int, trainer_nodes: int,
               generator_hosts: list[str] | None = None,
               trainer_hosts: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(generators' hosts, trainers' hosts) among the job's hosts ``job_hosts``.

    Raises:
        PlacementError: a named host is not one of the job's, or too few hosts are left.
    """
    for named, what in ((generator_hosts, "generator_nodelist"), (trainer_hosts, "trainer_nodelist")):
        missing = [h for h in named or [] if h not in job_hosts]
        if missing:
            raise PlacementError(f"launcher.slurm.{what} names {', '.join(missing)}, not among the job's "
                                 f"nodes {', '.join(job_hosts)}")
    others = [h for h in job_hosts if h not in (trainer_hosts or [])]
    gens = list(generator_hosts) if generator_hosts else others[:generator_nodes]
    trains = list(trainer_hosts) if trainer_hosts else [h for h in job_hosts if h not in gens][:trainer_nodes]
    if len(gens) != generator_nodes or len(trains) != trainer_nodes:
        raise PlacementError(f"the job's nodes {', '.join(job_hosts)} give {len(gens)} generator and {len(trains)} "
                             f"trainer node(s); the setup asks for {generator_nodes} and {trainer_nodes}")
    return gens, trains


def task_hosts(job_hosts: list[str], generators: int, trainers: int, generator_nodes: int,
               generator_hosts: list[str] | None = None, trainer_hosts: list[str] | None = None) -> list[str]:
    """The host of every task, in rank order (generators first): the lines of ``$SLURM_HOSTFILE``.

    Raises:
        PlacementError: see :func:`role_hosts`; ValueError: fewer tasks of a role than its nodes.
    """
    trainer_nodes = len(job_hosts) - generator_nodes
    gens, trains = role_hosts(job_hosts, generator_nodes, trainer_nodes, generator_hosts, trainer_hosts)
    nodes = gens + trains
    slots = role_map(generators, trainers, 1, generator_nodes=generator_nodes, trainer_nodes=trainer_nodes)
    return [nodes[slot.node] for slot in slots]


def setup_lines(slurm, generators: int, trainers: int, folder: str | None, python: str | None = None) -> list[str]:
    """The batch script's lines before ``srun`` for a job placed by role (``slurm``: the setup's
    ``launcher.slurm``): write the host file, export it and task 0's host."""
    hostfile = (f"{folder}/hosts-$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}" if folder
                else "${TMPDIR:-/tmp}/scalectl-hosts-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}")
    cmd = [python or sys.executable, "-m", "scalectl.launch.placement", "--generators", str(generators),
           "--trainers", str(trainers), "--generator-nodes", str(slurm.generator_nodes)]
    for flag, value in (("--generator-nodelist", slurm.generator_nodelist),
                        ("--trainer-nodelist", slurm.trainer_nodelist)):
        if value:
            cmd += [flag, value]
    return [f'export SLURM_HOSTFILE="{hostfile}"',
            " ".join(shlex.quote(c) for c in cmd) + ' > "$SLURM_HOSTFILE" || exit 1',
            f'export {MASTER_ADDR_ENV}="$(head -n 1 "$SLURM_HOSTFILE")"',
            "unset SLURM_NTASKS_PER_NODE   # srun places the tasks by the host file"]


def main(argv: list[str] | None = None) -> int:
    """Print the host of every task of this Slurm job (``$SLURM_JOB_NODELIST``), one a line."""
    parser = argparse.ArgumentParser(prog="python -m scalectl.launch.placement")
    parser.add_argument("--generators", type=int, required=True)
    parser.add_argument("--trainers", type=int, required=True)
    parser.add_argument("--generator-nodes", type=int, required=True)
    parser.add_argument("--generator-nodelist")
    parser.add_argument("--trainer-nodelist")
    args = parser.parse_args(argv)
    try:
        job = expand_hostlist(os.environ.get("SLURM_JOB_NODELIST", ""))
        hosts = task_hosts(job, args.generators, args.trainers, args.generator_nodes,
                           expand_hostlist(args.generator_nodelist) if args.generator_nodelist else None,
                           expand_hostlist(args.trainer_nodelist) if args.trainer_nodelist else None)
    except ValueError as exc:
        print(f"scalectl placement: {exc}", file=sys.stderr)
        return 2
    print("\n".join(hosts))
    print(f"scalectl placement: generators on {', '.join(dict.fromkeys(hosts[:args.generators]))}, trainers on "
          f"{', '.join(dict.fromkeys(hosts[args.generators:]))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
