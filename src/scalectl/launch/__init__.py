"""Launching runs: on this machine (:mod:`.local`) or on Slurm through submitit (:mod:`.slurm`).

Both sit behind :class:`~scalectl.launch.base.Launcher` (submit, state,
cancel, log paths); :func:`~scalectl.launch.base.refresh` keeps a run's status
in the store in step with its job; :mod:`.roles` tells each task of a
multi-task job its role (generator or trainer) and rank.
"""

from scalectl.launch.base import (
    LAUNCHER_TYPES, JobHandle, JobState, Launcher, RunSpec, get_launcher, last_job, reconcile, refresh,
)

__all__ = ["LAUNCHER_TYPES", "JobHandle", "JobState", "Launcher", "RunSpec", "get_launcher", "last_job",
           "reconcile", "refresh"]
