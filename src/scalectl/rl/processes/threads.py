"""How many torch threads a training process uses on a CPU.

A process uses every core it is given: ``hardware.threads`` when the recipe
sets it; else ``SLURM_CPUS_PER_TASK`` inside a Slurm task; else
``OMP_NUM_THREADS`` when the environment sets it; else the cores of the
process's CPU affinity mask (``os.sched_getaffinity``) shared equally by the
``processes`` that run on them (a pipeline's generators and trainer spawned on
one machine).  A single-process run (``sync``, ``ppo_off_policy``) counts as
one process even though it both generates and trains.
"""

from __future__ import annotations

import os


def cores_given() -> int:
    """Cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_threads(threads: int | None, processes: int = 1) -> int:
    """Threads for one of ``processes`` processes sharing this machine's cores.

    Args:
        threads: ``hardware.threads`` of the recipe, or None.
        processes: processes of the run sharing the cores of this node (>= 1).

    Returns:
        The thread count (>= 1), chosen as the module docstring says.
    """
    if threads:
        return int(threads)
    for var in ("SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return max(1, cores_given() // max(1, processes))


def set_cpu_threads(hardware, processes: int = 1) -> int:
    """Set torch's intra-op threads for a CPU run (:func:`cpu_threads`); on a GPU
    leave torch's setting alone.  Returns the threads torch uses."""
    import torch

    if hardware.device != "cpu":
        return torch.get_num_threads()
    n = cpu_threads(getattr(hardware, "threads", None), processes)
    torch.set_num_threads(n)
    return n
