"""``scalectl show``: one run with its evaluation points."""

from __future__ import annotations

from typing import Annotated

import typer

from scalectl.commands.common import (
    DbOption,
    JsonOption,
    open_store,
    out,
    print_json,
    user_errors,
)


@user_errors
def show(
    run: Annotated[str, typer.Argument(help="Run name or id.")],
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Show one run: its recipe summary, every evaluation point, and its evaluation series
    (scalectl evaluate) with their points."""
    with open_store(db) as store:
        info = store.get_run(run)
        points = store.points(info["id"])
        series = {s["series"]: (s, store.points(info["id"], s["series"])) for s in store.series(info["id"])}
    if json_:
        print_json({"run": info, "points": points,
                    "series": [{**{k: v for k, v in s.items() if k != "points"}, "points": pts}
                               for s, pts in series.values()]})
        return
    recipe = info.get("recipe") or {}
    out.print(f"[bold]{info['name']}[/bold] (id {info['id']}, hash {info['recipe_hash'] or '-'}, "
              f"status {info['status']}, launcher {info['launcher'] or '-'}, hardware {info['hardware'] or '-'})")
    if recipe:
        loss, asy = recipe.get("loss", {}), recipe.get("async", {})
        out.print(f"loss {loss.get('type')} ({loss.get('aggregation')} aggregation), advantage "
                  f"{recipe.get('advantage', {}).get('normalization')}, head {recipe.get('precision', {}).get('lm_head')}, "
                  f"async {asy.get('mode')} k={asy.get('k')}"
                  f"{' (fixed lag)' if asy.get('schedule') == 'fixed_lag' else ''}, run folder {info.get('run_dir') or '-'}")
    if info.get("warm_start"):
        out.print(describe_warm_start(info["warm_start"]), soft_wrap=True, highlight=False)
    from scalectl.display import Column, TableData, format_number
    from scalectl.present.console import print_table

    # The gpu_hours field holds device-hours: CPU-hours for a run on CPU.
    device = (recipe.get("hardware") or {}).get("device", "")
    hours = "CPU-hours" if device == "cpu" else "GPU-hours"
    cols = [Column("step", keep=True), Column(hours, priority=5), Column("FLOPs", priority=4),
            Column("tokens", priority=1), Column("pass rate", keep=True), Column("trunc.", priority=6),
            Column("mean len", priority=3), Column("reward", priority=2), Column("entropy", priority=0)]
    keys = ("gpu_hours", "flops", "tokens", "pass_rate", "truncation_rate", "mean_length", "train_reward", "entropy")
    digits = {"gpu_hours": 4, "mean_length": 1}
    print_table(TableData(None, cols, [
        [str(p["step"]), *(format_number(p[k], digits.get(k, 3), decimals=True) for k in keys)]
        for p in points]))
    errors = [(p["step"], p["checker_errors"]) for p in points if p.get("checker_errors")]
    if errors:
        out.print(f"[yellow]the answer checker could not judge {sum(n for _, n in errors)} held-out completion(s)"
                  f"[/yellow] (scored wrong; steps {', '.join(str(s) for s, _ in errors[:8])}"
                  f"{' ...' if len(errors) > 8 else ''}): their pass rates are lower bounds; the run's "
                  "steps.jsonl counts those of its rollouts (checker_errors)", soft_wrap=True, highlight=False)
    for name, (meta, pts) in series.items():
        out.print(f"[bold]series {name}[/bold]: {meta['prompts']} prompts of {meta['source']}, "
                  f"mean@{meta['samples_per_prompt']}", soft_wrap=True, highlight=False)
        print_table(TableData(None, cols[:2] + [cols[4], cols[5]], [
            [str(p["step"]), *(format_number(p[k], digits.get(k, 3), decimals=True)
                               for k in ("gpu_hours", "pass_rate", "truncation_rate"))] for p in pts]))


def describe_warm_start(ws: dict) -> str:
    """One line on the checkpoint a run started from (the store's ``runs.warm_start``)."""
    where = ws.get("name") or ws.get("path") or "-"
    text = f"starts from: {ws.get('source', '?')} warm start {where}" if ws.get("source") != "checkpoint" \
        else f"starts from: checkpoint {where}"
    if ws.get("steps") is not None:
        text += f", {ws['steps']} SFT steps to check pass rate {ws['pass_rate']:.3f}"
    return text + f", weights sha256 {ws.get('sha256') or '-'}"


def register(app: typer.Typer) -> None:
    """Add ``show`` to the app."""
    app.command()(show)
