"""``scalectl evaluate``: evaluate a run's checkpoints after the fact, on any prompt set."""

from __future__ import annotations

import functools
from typing import Annotated

import typer

from scalectl.commands.common import (
    DbOption,
    JsonOption,
    err,
    open_store,
    out,
    print_json,
    user_errors,
)


@user_errors
def evaluate(
    run: Annotated[str, typer.Argument(help="Run name or id.")],
    step: Annotated[int | None, typer.Option("--step", help="The checkpoint of this step (default: the latest).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every checkpoint the run folder keeps.")] = False,
    data: Annotated[str | None, typer.Option(
        "--data", help="A prompt set (.jsonl, .json, .parquet or hf:NAME) to evaluate on, every prompt of it; "
                       "default: the run's own held-out prompts.")] = None,
    samples: Annotated[int | None, typer.Option(
        "--samples", min=1, help="Completions per prompt, k (default: the run's eval.samples_per_prompt).")] = None,
    series: Annotated[str | None, typer.Option(
        "--series", help="Name of the series stored (default: the data file's stem, or held-out).")] = None,
    set_: Annotated[list[str], typer.Option(
        "--set", help="Override KEY=VALUE of the run's recipe for this evaluation (repeatable): length.*, "
                      "eval.*, reward.*, and data.prompt_key, answer_key, split, subset of --data; e.g. "
                      "length.max_prompt_tokens=1024 for longer prompts.")] = [],
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Evaluate checkpoints of a run with its own protocol (its engine, evaluation temperature and
    seed, mean@k, its reward) and store the points as a named evaluation series beside the run's
    own (`scalectl show`, `fit --series`, `compare --series`).  --set changes the protocol for this
    evaluation as `run --set` changes a recipe (the same KEY=VALUE parsing): the lengths (a set whose
    prompts are longer than the run's length.max_prompt_tokens needs a larger one), the evaluation,
    the reward and how the columns of --data are read; never the model."""
    from scalectl.errors import UserError
    from scalectl.job.checkpoints import evaluate_run

    if step is not None and all_:
        raise UserError("give --step N or --all, not both")
    info, found = evaluate_run(functools.partial(open_store, db), run, step=step, every=all_, data=data,
                               samples=samples, series=series, overrides=tuple(set_),
                               log=lambda m: err.print(m, markup=False))
    if json_:
        print_json({"run": info["name"], "series": found.name, "source": found.source, "prompts": found.prompts,
                    "points": [p.to_dict() for p in found.points]})
        return
    for p in found.points:
        out.print(f"{info['name']} {found.name} step {p.step}: pass rate {p.pass_rate:.4f} (mean@{p.samples_per_prompt} "
                  f"on {found.prompts} prompts of {found.source}), truncation {p.truncation_rate:.3f}",
                  markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``evaluate`` to the app."""
    app.command()(evaluate)
