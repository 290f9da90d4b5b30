"""The ``scalectl`` command line: a thin typer app over the library.

Each command lives in its own module of :mod:`scalectl.commands`; this module only
assembles them, and the console script only the module of the command it runs
(:data:`COMMANDS`).  Nothing here imports torch, deepspeed or vLLM: the commands
that train import them when they run.
"""

from __future__ import annotations

import importlib
import signal
import sys

import typer
import typer.core
import typer.main

#: Each command, by the module of :mod:`scalectl.commands` that registers it (named for it;
#: ``import_`` for ``import``), in the order ``--help`` lists them.  The console script imports only the module of the
#: command it is given (a test checks this table against what the modules register).
COMMANDS: dict[str, str] = {
    "validate": "validate", "recipes": "recipes", "init": "init",
    "run": "run",
    "runs": "runs", "show": "show", "import": "import_", "evaluate": "evaluate", "export": "export", "rm": "rm",
    "fit": "fit", "compare": "compare", "margin": "margin", "extrapolate": "extrapolate", "forecast": "forecast",
    "status": "status", "cancel": "cancel", "logs": "logs",
    "ablate": "ablate", "report": "report",
    "serve": "serve",
}

#: Command modules, in the order their commands appear in ``--help``.
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))


def build_app(modules: tuple[str, ...] = COMMAND_MODULES) -> typer.Typer:
    """The typer app with the commands of ``modules`` (names in :data:`COMMAND_MODULES`;
    all of them by default).  Importing a command module costs its imports and typer's
    building of its parameters, so the console script builds only the one it runs."""
    built = typer.Typer(
        name="scalectl",
        help="Orchestrate RL-for-LLM recipe ablations and fit their compute-scaling curves "
             "(ScaleRL: R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)).",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    # A group even with one command: ``scalectl serve`` names its command as always.
    built.callback()(_group)
    for name in modules:
        importlib.import_module(f"scalectl.commands.{name}").register(built)
    return built


def _group() -> None:
    pass


def __getattr__(name: str):
    # ``scalectl.cli.app``, the app with every command, is built on first use.
    if name == "app":
        globals()["app"] = built = build_app()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def modules_for(args: list[str]) -> tuple[str, ...]:
    """The command modules a command line needs: the one of its command when its first
    word is a command of :data:`COMMANDS`, else all of them (``--help``, no command, or
    a misspelt one, which click answers with the list)."""
    first = args[0] if args else None
    return (COMMANDS[first],) if first in COMMANDS else COMMAND_MODULES


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


def command(built: typer.Typer):
    """The click command of ``built`` (:func:`build_app`), its options given click-style
    metavars (:func:`option_metavar`)."""
    group = typer.main.get_command(built)
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
    """Entry point of the console script: builds the app with the module of the command
    given (:func:`modules_for`) and runs it.

    SIGINT is restored to Python's KeyboardInterrupt first: started from a background shell
    (``scalectl ablate ... &``, some CI runners) the process inherits it ignored, and Python
    keeps it so, and then neither ``kill -INT`` nor ``scalectl cancel`` of a foreground run would
    stop it with its checkpoint (the local job bodies do the same, :func:`scalectl.launch.local.main`).
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    command(build_app(modules_for(sys.argv[1:])))()
