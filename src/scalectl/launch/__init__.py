"""Launching runs: on this machine (:mod:`.local`) or on Slurm through submitit (:mod:`.slurm`).

Both sit behind :class:`~scalectl.launch.base.Launcher` (submit, state,
cancel, log paths, dry-run description) and are found by name in
:mod:`.registry`, which also keeps a run's status in the store in step with
its job (:func:`~scalectl.launch.registry.refresh`).  The job body they run
is :mod:`scalectl.job.body`.
"""
