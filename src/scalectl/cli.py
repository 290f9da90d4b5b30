"""The ``scalectl`` command line: a thin typer app over the library.

Each family of commands lives in :mod:`scalectl.commands`; this module only
assembles them.  Nothing here imports torch, deepspeed or vLLM: the commands
that train import them when they run.
"""

from __future__ import annotations

import importlib

import typer
import typer.core
import typer.main

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


#: How ``--help`` names an option's value, by its type (click's words; typer's own help
#: prints Python types such as ``<list[str]>`` and ``<bool>``).
METAVARS = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "Path": "PATH"}


def option_metavar(option) -> str | None:
    """The metavar ``--help`` shows for a typer option: none for a flag, ``KEY=VALUE`` for
    ``--set``, else click's name of its type (``TEXT``, ``INTEGER``, ``FLOAT``, ``PATH``; a
    repeatable option as its element); None (typer's own) for any other type."""
    if getattr(option, "is_flag", False):
        return ""
    if "--set" in option.opts:
        return "KEY=VALUE"
    bare = option.bare_type()
    return METAVARS.get(bare.removeprefix("list[").removesuffix("]"))


def command():
    """The click command of :data:`app`, its options given click-style metavars
    (:func:`option_metavar`)."""
    group = typer.main.get_command(app)
    for cmd in (group, *group.commands.values()):
        help_option = cmd.get_help_option(cmd.context_class(cmd, **cmd.context_settings))   # made once, kept
        for param in (*cmd.params, *([help_option] if help_option else [])):
            if isinstance(param, typer.core.TyperOption) and param.metavar is None:
                param.metavar = option_metavar(param)
            elif isinstance(param, typer.core.TyperArgument) and (label := option_metavar(param)):
                # typer prints an argument's type from its annotation alone; this one argument's instead
                param.display_type_rich = lambda ctx, label=label: label
    return group


def main() -> None:
    """Entry point of the console script."""
    command()()
