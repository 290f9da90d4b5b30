"""The ``scalectl`` command line: a thin typer app over the library.

Each family of commands lives in :mod:`scalectl.commands`; this module only
assembles them.  Nothing here imports torch, deepspeed or vLLM: the commands
that train import them when they run.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="scalectl",
    help="Orchestrate RL-for-LLM recipe ablations and fit their compute-scaling curves "
         "(ScaleRL: R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: Command modules, in the order their commands appear in ``--help``.
COMMAND_MODULES = ("recipes", "presets", "train", "store", "science", "launch", "ablate", "serve")

for _name in COMMAND_MODULES:
    importlib.import_module(f"scalectl.commands.{_name}").register(app)


def main() -> None:
    """Entry point of the console script."""
    app()
