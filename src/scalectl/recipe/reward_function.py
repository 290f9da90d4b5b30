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

A function may be written for another trainer (``reward.convention``, :data:`CONVENTIONS`):
verl's ``custom_reward_function`` (``compute_score(data_source, solution_str, ground_truth,
extra_info=None)``) or TRL's GRPOTrainer ``reward_funcs`` (``reward_func(completions,
**kwargs)`` over a batch); unset, the convention is recognised from the signature
(:func:`convention_of`), and :mod:`scalectl.rl.reward.conventions` calls each.

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

#: The largest magnitude of a reward (a function's, ``reward.truncated``).  Rewards go into
#: float32 tensors and the advantages take squares of their differences summed over a batch:
#: 1e15 keeps those sums finite in float32 (4e30 per completion, up to ~8e7 completions a
#: batch), while 1e30 already overflowed a group's variance to inf (advantages all 0) and
#: 1e300 became an inf reward (advantages NaN).
MAX_ABS_REWARD = 1e15
#: The calling conventions of reward functions (``reward.convention``): scalectl's own, verl's
#: ``custom_reward_function`` (its NaiveRewardManager's call) and TRL's GRPOTrainer reward
#: functions (``GRPOTrainer._calculate_rewards``).
CONVENTIONS = ("scalectl", "verl", "trl")
#: How a function of each convention is called and what it returns (docs/rewards.md).
SHAPES = {
    "scalectl": "f(completion, gold, fields) or f(completion, gold, **fields), returning a float or a Score",
    "verl": "compute_score(data_source, solution_str, ground_truth, extra_info=None), returning a float or a "
            "dict with a 'score' key",
    "trl": "reward_func(completions, **kwargs) over a batch (prompts, completions, completion_ids and the row's "
           "columns as keyword lists), returning a list of floats or None",
}
#: The keyword arguments verl's NaiveRewardManager passes to ``compute_score``.
VERL_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")
#: The keyword arguments TRL's GRPOTrainer passes to every reward function, besides the columns.
TRL_KEYWORDS = ("prompts", "completions", "completion_ids")


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


def _misfit(sig: inspect.Signature, convention: str) -> str | None:
    """Why a function of signature ``sig`` cannot be called as ``convention`` calls it (the
    message of :meth:`inspect.Signature.bind`), or None when it can."""
    params = sig.parameters.values()
    try:
        if convention == "verl":
            sig.bind(**dict.fromkeys(VERL_KEYWORDS))
        elif convention == "trl":
            # the row's columns come as keywords too: a required parameter may name one
            sig.bind_partial(**dict.fromkeys(TRL_KEYWORDS))
            positional = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
            if positional:
                return f"parameter {positional[0]!r} is positional-only (TRL passes keywords)"
        else:
            try:
                sig.bind("completion", "gold", {})
            except TypeError:
                sig.bind("completion", "gold")        # f(completion, gold, **fields)
                if not any(p.kind is p.VAR_KEYWORD for p in params):
                    raise
    except TypeError as exc:
        return str(exc)
    return None


def fields_as_keywords(function) -> bool:
    """Whether a function of the ``scalectl`` convention takes the row as keyword arguments
    (``f(completion, gold, **fields)``) rather than as one dict (``f(completion, gold, fields)``,
    preferred when both fit)."""
    try:
        inspect.signature(function).bind("completion", "gold", {})
    except TypeError:
        return True
    except ValueError:          # no signature to read
        return False
    return False


def convention_of(function, declared: str | None = None) -> str:
    """The calling convention of ``function`` (one of :data:`CONVENTIONS`).

    ``declared`` (``reward.convention``) is checked against the signature.  Unset, the
    convention is recognised: verl or TRL when the function fits that call and names one of
    its parameters (:data:`VERL_KEYWORDS`, :data:`TRL_KEYWORDS`; both pass keywords), else
    scalectl when it fits, else the one foreign call it fits.  A function without a signature
    to read (a builtin) is taken as ``declared`` or scalectl.

    Raises:
        ValueError: it fits the declared convention not, none, or (unset) several equally (the
            message says which, and how each of the three conventions calls a function:
            :data:`SHAPES`).
    """
    try:
        sig = inspect.signature(function)
    except (ValueError, TypeError):
        return declared or "scalectl"
    misfits = {c: _misfit(sig, c) for c in CONVENTIONS}
    if declared is not None:
        if misfits[declared] is None:
            return declared
        raise ValueError(f"cannot be called as reward.convention = {declared!r} calls it, "
                         f"{SHAPES[declared]}: {misfits[declared]}")
    names = set(sig.parameters)
    named = [c for c, words in (("verl", VERL_KEYWORDS[:3]), ("trl", TRL_KEYWORDS))
             if misfits[c] is None and names & set(words)]
    if not named and misfits["scalectl"] is None:
        return "scalectl"
    fitting = named or [c for c in ("verl", "trl") if misfits[c] is None]
    if len(fitting) == 1:
        return fitting[0]
    shapes = "; ".join(f"{c}: {shape}" for c, shape in SHAPES.items())
    if fitting:
        raise ValueError(f"fits the calls of {' and '.join(fitting)} alike; say which with reward.convention "
                         f"= {' or '.join(repr(c) for c in fitting)}, or write it in one of the three accepted "
                         f"shapes ({shapes})")
    meant = next((c for c, words in (("verl", VERL_KEYWORDS[:3]), ("trl", TRL_KEYWORDS)) if names & set(words)),
                 "scalectl")
    raise ValueError(f"fits none of the three accepted shapes ({shapes}); as {meant} calls it: {misfits[meant]}")


def import_reward(name: str, convention: str | None = None) -> tuple[object, str]:
    """The callable ``name`` (``package.module:callable``) names, imported in this process,
    and its calling convention (``convention`` checked, or recognised: :func:`convention_of`).

    The current folder is appended to ``sys.path`` first (see the module docstring).

    Raises:
        UserError: naming ``reward.function`` and its value: a malformed name, a module
            that cannot be imported (with the import's own error), no such attribute, an
            attribute that is not callable, or one whose signature fits no convention, the
            declared one or several (naming its file and the accepted shapes).
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
    where = getattr(obj, "__file__", None) or "?"
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{key}: module {module_name!r} ({where}) has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{key} is not a function (an object of type {type(obj).__name__})")
    try:
        return obj, convention_of(obj, convention)
    except ValueError as exc:
        raise UserError(f"{key} (in {where}) {exc}") from None


def convention_line(name: str, declared: str | None, convention: str) -> str:
    """What ``scalectl validate`` says of a reward function of the user's: ``name``
    (``package.module:callable``), the ``convention`` it is called with (one of
    :data:`CONVENTIONS`), whether ``declared`` (``reward.convention``) or recognised from
    its signature (``declared`` None), and how that convention calls it (:data:`SHAPES`)."""
    how = "as reward.convention says" if declared is not None else "recognised from its signature"
    return f"reward.function = {name!r}: convention {convention} ({how}), called as {SHAPES[convention]}"


def import_function(name: str, convention: str | None = None):
    """The callable of :func:`import_reward` alone (same errors)."""
    return import_reward(name, convention)[0]


def function_problems(function: str, answer_format: str, *, think_tags: bool, model_path: str,
                      convention: str | None = None) -> list[tuple[str, str]]:
    """What stops a ``[reward]`` section from working with this recipe, found before a run.

    * the function cannot be imported here, or its signature fits not ``convention``
      (``reward.convention``; unset: no convention or several: :func:`import_reward`);
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
            import_reward(function, convention)
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
