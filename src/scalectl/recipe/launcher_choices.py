"""The launchers a setup can choose (``launcher.type``, ``--launcher``), by name.

One table, :data:`LAUNCHER_CHOICES`: the recipe schema builds ``launcher.type``'s
allowed values from its keys, and the launcher registry
(:data:`scalectl.launch.registry.LAUNCHERS`) maps exactly these names to the modules
that implement them.  Names only, so that validating a recipe imports no launcher
(nor submitit).
"""

from __future__ import annotations

#: Launcher name -> what it runs a job on (docs/launching.md).
LAUNCHER_CHOICES: dict[str, str] = {
    "local": "processes on this machine, in the foreground or detached, at most "
             "launcher.max_parallel at once (docs/launching.md, \"Local\")",
    "slurm": "a Slurm job submitted through submitit, with the resources of [launcher.slurm] "
             "(docs/launching.md, \"Slurm\")",
}
LAUNCHER_NAMES = tuple(LAUNCHER_CHOICES)
DEFAULT_LAUNCHER = "local"
