"""Reward functions by name: ``reward.function = "package.module:callable"``.

The recipe names the function that scores every completion (:class:`scalectl.recipe.schema.Reward`);
this module reads and imports such names.  The name is checked when the recipe is
validated (:func:`check_name`: its form only, so that a stored recipe validates on any
machine); the function itself is imported where it is needed (:func:`import_function`:
``scalectl validate`` with its files checked, and every process that scores).  The
trainer calls it as documented in docs/rewards.md (:mod:`scalectl.rl.reward.scoring`).

Modules are found as ``python -m`` finds them: on ``PYTHONPATH``, among the installed
packages, and in the current folder (appended to ``sys.path``, after the rest), so that
``mypkg/rewards.py`` beside the recipe works without installing it.

Pure Python: no torch, no pydantic.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys

from scalectl.errors import UserError

#: The built-in math checker (last ``\\boxed{}`` or another answer format, math-verify, +-1).
BUILTIN_REWARD = "scalectl.rl.reward.checker:score"
#: Where the built-in checker looks for the final answer (``reward.format``), and the
#: instruction each appends to a prompt (:mod:`scalectl.rl.reward.formats` holds both).
ANSWER_FORMATS = ("boxed", "gsm8k", "last_line")

_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def check_name(name: str) -> str:
    """``name`` when it has the form ``package.module:callable`` (dotted identifiers on
    both sides of one colon; the right side may reach into a class: ``mod:Cls.method``).

    Raises:
        ValueError: another form (pydantic reports it under ``reward.function``).
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} does not name a function as 'package.module:callable' "
                         f"(the built-in checker is {BUILTIN_REWARD!r})")
    return name


def import_function(name: str):
    """The callable ``name`` (``package.module:callable``) names, imported in this process.

    The current folder is appended to ``sys.path`` first (see the module docstring), and
    the callable must take three positional arguments (completion, gold, fields).

    Raises:
        UserError: naming ``reward.function`` and its value: a malformed name, a module
            that cannot be imported (with the import's own error), no such attribute, an
            attribute that is not callable, or one that cannot take three arguments.
    """
    key = f"reward.function = {name!r}"
    try:
        check_name(name)
    except ValueError as exc:
        raise UserError(f"reward.function: {exc}") from None
    module_name, attr = name.split(":")
    here = os.getcwd()
    if here not in sys.path:
        sys.path.append(here)
    try:
        obj = importlib.import_module(module_name)
    except BaseException as exc:  # noqa: BLE001 - the user's module may raise anything while importing
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UserError(f"{key} cannot be imported: {type(exc).__name__}: {exc} (modules are looked for on "
                        "PYTHONPATH, among the installed packages and in the current folder)") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{key}: module {module_name!r} ({getattr(obj, '__file__', '?')}) has no "
                            f"attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{key} is not a function (an object of type {type(obj).__name__})")
    try:
        inspect.signature(obj).bind("completion", "gold", {})
    except TypeError as exc:
        raise UserError(f"{key} cannot be called as f(completion, gold, fields): {exc}") from None
    except ValueError:          # no signature to read (a builtin): calls will tell
        pass
    return obj


def function_problems(function: str, answer_format: str, *, think_tags: bool, model_path: str) -> list[tuple[str, str]]:
    """What stops a ``[reward]`` section from working with this recipe, found before a run.

    * the function cannot be imported here (:func:`import_function`);
    * ``model.think_tags`` with a function of the user's: it receives the whole completion,
      so the key would have no effect (the built-in checker reads after ``</think>``);
    * ``builtin:tiny`` with the built-in checker and a format other than ``boxed``: the
      built-in model is warm-started to answer in ``\\boxed{}``, so every completion would
      score -1.

    Returns:
        ``(dotted key, message)`` for each problem; empty when all is well.
    """
    problems = []
    if function != BUILTIN_REWARD:
        try:
            import_function(function)
        except UserError as exc:
            problems.append(("reward.function", str(exc)))
        if think_tags:
            problems.append(("model.think_tags", think_tags_problem(function)))
    elif model_path.startswith("builtin:") and answer_format != "boxed":
        problems.append(("reward.format", f"reward.format = {answer_format!r}: model.path = {model_path!r} is "
                         "warm-started to answer in \\boxed{}, so the built-in checker would score every "
                         "completion -1; use 'boxed', or a model of your own"))
    return problems


def think_tags_problem(function: str) -> str:
    """Why ``model.think_tags = true`` is refused with ``reward.function = function`` (not the
    built-in checker)."""
    return (f"model.think_tags = true has no effect with reward.function = {function!r}: a reward function "
            "receives the whole completion, thinking included; set it to false "
            "(scalectl.rl.reward.gold.graded_text gives the text after the last </think>)")
