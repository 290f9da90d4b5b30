"""A run's checkpoints after the fact: evaluated on any prompt set, exported as a transformers folder.

A checkpoint (:mod:`scalectl.rl.checkpoint`) holds the DeepSpeed engine of the trainer
(``engine/latest/mp_rank_00_model_states.pt``: the module's weights in ``model.dtype`` at ZeRO
stages 0-2; partitions at stage 3, gathered here by DeepSpeed's ``zero_to_fp32``) and the loop's
state (``state.pt``: the step and the compute meter).  :func:`load_policy_at` puts the weights
into the run's own architecture: the tiny Qwen2 for ``builtin:tiny``, the checkpoint folder's
``config.json`` and tokenizer otherwise.

:func:`evaluate_checkpoints` evaluates with the run's own protocol: its rollout engine, the
evaluation temperature, ``eval.samples_per_prompt`` completions per prompt (or ``samples``), its
evaluation seed and its reward, through :class:`scalectl.rl.evaluation.during_training.Evaluations`
as the run evaluates itself.  On its own held-out prompts a checkpoint thus gives the point the run
stored at that step; on another set (``data``: a ``.jsonl``/``.json``/``.parquet`` file or
``hf:NAME``), every prompt of it, rendered and filtered as the run renders its own (chat template,
answer instruction, ``length.max_prompt_tokens``).  ``overrides`` (``evaluate --set``) change the
lengths, the evaluation, the reward and how a set's columns are read, never the model.  Each point carries the compute of its
checkpoint (GPU-hours, FLOPs, tokens), so a series lies on the run's own axes.

:func:`export_checkpoint` writes the weights with ``save_pretrained`` beside the tokenizer and the
generation config: a folder ``AutoModelForCausalLM.from_pretrained``, vLLM and lm-eval load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from scalectl.errors import UserError

#: The series name of a run's own held-out prompts.
HELD_OUT = "held-out"
_STEP = re.compile(r"^step-(\d+)$")


def checkpoint_steps(run_dir: str | Path) -> dict[int, Path]:
    """The complete checkpoints of a run folder by step (:func:`scalectl.rl.checkpoint.complete_checkpoints`)."""
    from scalectl.rl.checkpoint import complete_checkpoints

    found = {}
    for path in complete_checkpoints(Path(run_dir)):
        match = _STEP.match(path.name)
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def pick_checkpoints(name: str, run_dir: str | Path, step: int | None = None, every: bool = False) -> dict[int, Path]:
    """The checkpoints asked for: ``step``'s, all of them (``every``), or the latest.

    Raises:
        UserError: no checkpoint, or none at ``step`` (naming those kept and ``checkpoint.keep``).
    """
    found = checkpoint_steps(run_dir)
    if not found:
        raise UserError(f"run {name} has no checkpoint in {run_dir}")
    if every:
        return found
    if step is None:
        last = max(found)
        return {last: found[last]}
    if step not in found:
        raise UserError(f"run {name} has no checkpoint at step {step}; kept: {', '.join(map(str, found))} "
                        "(checkpoint.keep of a recipe sets how many are kept)")
    return {step: found[step]}


def read_weights(checkpoint: Path) -> dict:
    """The policy's weights of a checkpoint folder, by parameter name (those of the transformers model).

    Raises:
        UserError: the engine's files cannot be read.
    """
    import torch

    engine = Path(checkpoint) / "engine"
    states = engine / "latest" / "mp_rank_00_model_states.pt"
    try:
        saved = torch.load(states, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError) as exc:
        raise UserError(f"{states}: cannot read the checkpoint's weights ({exc})") from None
    if (saved.get("ds_config") or {}).get("zero_optimization", {}).get("stage") == 3:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return dict(get_fp32_state_dict_from_zero_checkpoint(str(engine), tag="latest"))
    return dict(saved["module"])


def load_policy_at(recipe, checkpoint: Path):
    """(model, tokenizer) of the run's architecture holding the weights of ``checkpoint``, in
    ``model.dtype``, in eval mode.

    Raises:
        UserError: weights that do not fit the architecture (naming the keys).
    """
    from scalectl.rl.policy.model import DTYPES, build_tiny_model, build_tokenizer, load_policy

    if recipe.model.path.startswith("builtin:"):
        model, tokenizer = build_tiny_model(), build_tokenizer()
        model = model.to(DTYPES[recipe.model.dtype])
    else:
        model, tokenizer = load_policy(recipe.model.path, recipe.model.dtype)
    weights = read_weights(checkpoint)
    dtype = next(model.parameters()).dtype
    try:
        model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=True)
    except RuntimeError as exc:
        raise UserError(f"{checkpoint}: its weights do not fit model.path = {recipe.model.path!r} ({exc})") from None
    return model.eval(), tokenizer


def checkpoint_compute(checkpoint: Path) -> dict:
    """The point fields of a checkpoint's compute meter: step, gpu_hours, flops, tokens, samples,
    wall_seconds (:class:`scalectl.rl.accounting.ComputeMeter`)."""
    import torch

    from scalectl.rl.accounting import ComputeMeter

    state = torch.load(Path(checkpoint) / "state.pt", map_location="cpu", weights_only=False)
    meter = ComputeMeter.from_dict(state["meter"])
    return dict(step=int(state["step"]), gpu_hours=meter.gpu_hours, flops=meter.flops, tokens=meter.tokens,
                samples=meter.samples, wall_seconds=meter.seconds)


@dataclass(frozen=True)
class Series:
    """The points of one evaluation series: its ``name``, the prompt set (``source``, ``prompts``
    of it) and a point (:class:`scalectl.points.EvalPoint`) per checkpoint, by step."""

    name: str
    source: str
    prompts: int
    points: list


def prompt_set(recipe, data: str | None, tokenizer, log: Callable[[str], None],
               data_keys: dict | None = None) -> tuple[list, str]:
    """The prompts a series evaluates: the run's held-out split, or every prompt of ``data``
    rendered and filtered as the run's own (:func:`scalectl.rl.data.splits.load_prompt_sets`
    of the recipe with ``data.source = data`` and the ``data_keys`` given: ``prompt_key``,
    ``answer_key``, ``split``, ``subset``).  Returns (problems, what they are).

    Raises:
        UserError: a set that cannot be read, or that keeps fewer than 2 prompts.
    """
    from scalectl.recipe.schema import Recipe
    from scalectl.rl.data.splits import load_prompt_sets

    if data is None:
        return load_prompt_sets(recipe, tokenizer, log=log)[1], f"the held-out split of {recipe.data.source}"
    raw = recipe.to_dict()
    raw["data"] = {**(data_keys or {}), "source": str(data), "seed": 0}
    raw["eval"] = {**raw["eval"], "prompts": 1}           # one held-out prompt: the rest is every other one
    other = Recipe.model_validate(raw)
    train, held_out = load_prompt_sets(other, tokenizer, log=log)
    problems = sorted(train + held_out, key=lambda p: getattr(p, "row", p.id))
    return [replace(p, id=i) for i, p in enumerate(problems)], str(data)


def evaluate_checkpoints(recipe, run_dir: str | Path, checkpoints: dict[int, Path], *, data: str | None = None,
                         samples: int | None = None, series: str | None = None, overrides: tuple[str, ...] = (),
                         log: Callable[[str], None] = lambda m: None) -> Series:
    """Evaluate checkpoints of a run with its own protocol (the module docstring).

    Args:
        recipe: the run's :class:`scalectl.recipe.schema.Recipe`.
        checkpoints: step -> checkpoint folder (:func:`pick_checkpoints`).
        data: another prompt set (a file or ``hf:NAME``); None: the run's held-out prompts.
        samples: completions per prompt (k); None: ``eval.samples_per_prompt``.
        series: the series' name; None: the file's stem, or ``held-out``.
        overrides: ``KEY=VALUE`` changes of the protocol (``evaluate --set``: the lengths, the
            evaluation, the reward, how ``data``'s columns are read;
            :func:`scalectl.recipe.load.evaluated_recipe`).

    Returns:
        The :class:`Series`, a point per checkpoint in step order.

    Raises:
        UserError: an override that may not change or does not validate; see :func:`prompt_set`.
    """
    from scalectl.recipe.load import evaluated_recipe
    from scalectl.recipe.schema import Recipe
    from scalectl.rl.evaluation.during_training import Evaluations
    from scalectl.rl.processes.threads import set_cpu_threads
    from scalectl.rl.rollout import make_engine

    recipe, data_keys = evaluated_recipe(recipe, overrides)
    if samples is not None:
        raw = recipe.to_dict()
        raw["eval"] = {**raw["eval"], "samples_per_prompt": samples}
        recipe = Recipe.model_validate(raw)
    set_cpu_threads(recipe.hardware, processes=1)         # as the run's own process, so as its numbers
    name = series or (HELD_OUT if data is None else Path(str(data).removeprefix("hf:")).stem)
    points, problems, source = [], None, None
    for step, path in checkpoints.items():
        model, tokenizer = load_policy_at(recipe, path)
        if problems is None:
            problems, source = prompt_set(recipe, data, tokenizer, log, data_keys)
        evals = Evaluations(recipe, make_engine(recipe, model, tokenizer), problems)
        ((point, seconds),) = evals.start(checkpoint_compute(path), wait=True)
        log(f"step {step}: pass rate {point.pass_rate:.4f} on {len(problems)} prompts x "
            f"{recipe.eval.samples_per_prompt} ({seconds:.1f} s)")
        points.append(point)
    return Series(name, source, len(problems), points)


def export_checkpoint(recipe, checkpoint: Path, folder: str | Path) -> Path:
    """Write the policy of ``checkpoint`` to ``folder`` with ``save_pretrained`` (weights in
    safetensors, config, generation config, tokenizer).

    Raises:
        UserError: ``folder`` exists and is not empty, or cannot be written.
    """
    from scalectl.rl.policy.model import save_policy

    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"{folder}: exists and is not an empty folder; give a new one")
    model, tokenizer = load_policy_at(recipe, checkpoint)
    try:
        save_policy(model, tokenizer, folder)
    except OSError as exc:
        raise UserError(f"{folder}: cannot write the model ({exc.strerror or exc})") from None
    return folder


def run_checkpoints(store, ref, step: int | None = None, every: bool = False) -> tuple[dict, object, dict[int, Path]]:
    """A stored run, its recipe and the checkpoints asked for (:func:`pick_checkpoints`).

    Raises:
        UserError: no such run, an imported run (no checkpoints), no checkpoint asked for.
    """
    from scalectl.recipe.schema import Recipe

    info = store.get_run(ref)
    if info.get("source") == "import" or not info.get("run_dir"):
        raise UserError(f"run {info['name']} has no run folder (imported runs have no checkpoints)")
    if str(info["recipe"].get("model", {}).get("path", "")).startswith("simulated:"):
        raise UserError(f"run {info['name']} is simulated: it has no model to evaluate")
    recipe = Recipe.model_validate(info["recipe"])
    return info, recipe, pick_checkpoints(info["name"], info["run_dir"], step, every)


def evaluate_run(stores, ref, *, step: int | None = None, every: bool = False, data: str | None = None,
                 samples: int | None = None, series: str | None = None, overrides: tuple[str, ...] = (),
                 log: Callable[[str], None] = lambda m: None) -> tuple[dict, Series]:
    """``scalectl evaluate``: evaluate checkpoints of a stored run (:func:`evaluate_checkpoints`)
    and store the points as its evaluation series (``series_points``; a step evaluated again
    replaces its point).  No connection to the store stays open while evaluating.

    Args:
        stores: opens the store (``stores(create=False)``, as :mod:`scalectl.launch.runs`).
        step, every: which checkpoints (default: the latest).
        overrides: ``evaluate --set`` (:func:`evaluate_checkpoints`), checked before any checkpoint loads.

    Returns:
        (the run's row, the :class:`Series` stored).

    Raises:
        UserError: see :func:`run_checkpoints`, :func:`prompt_set`.
    """
    from scalectl.recipe.load import evaluated_recipe

    with stores(create=False) as store:
        info, recipe, checkpoints = run_checkpoints(store, ref, step, every)
    evaluated_recipe(recipe, overrides)             # a key that may not change: refused before any work
    log(f"run {info['name']}: evaluating step(s) {', '.join(map(str, checkpoints))}")
    found = evaluate_checkpoints(recipe, info["run_dir"], checkpoints, data=data, samples=samples, series=series,
                                 overrides=tuple(overrides), log=log)
    with stores(create=False) as store:
        store.add_series_points(info["id"], found.name, found.source, found.prompts, found.points)
    return info, found
