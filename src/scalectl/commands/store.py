"""``scalectl runs``, ``show`` and ``import``: what the store holds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from scalectl.commands.common import DbOption, JsonOption, err, fmt, open_store, out, print_json, user_errors


@user_errors
def runs(db: DbOption = None, json_: JsonOption = False) -> None:
    """List every run in the store with its status and last evaluation point.

    The status of a run whose job should be alive is checked with its launcher,
    as `scalectl status` does (a job killed outright shows as failed)."""
    from scalectl.launch.registry import current_runs

    with open_store(db) as store:
        rows = current_runs(store)
    if json_:
        print_json([{k: v for k, v in r.items() if k != "recipe"} for r in rows])
        return
    from scalectl.display import Column, fitted_table

    cols = [Column("id", priority=1), Column("name", "left", keep=True), Column("hash", "left", priority=0),
            Column("status", "left", keep=True), Column("launcher", "left", priority=2),
            Column("hardware", "left", priority=3), Column("points", priority=5),
            Column("last step", priority=4), Column("pass rate", keep=True), Column("trunc.", priority=6)]
    table = fitted_table(f"runs in {db or 'the store'}", cols, [
        [str(r["id"]), r["name"], r["recipe_hash"] or "-", r["status"], r["launcher"] or "-",
         r["hardware"] or "-", str(r["n_points"]), fmt(r["last_step"]), fmt(r["last_pass_rate"]),
         fmt(r["last_truncation_rate"])] for r in rows], out.width)
    out.print(table)


@user_errors
def show(
    run: Annotated[str, typer.Argument(help="Run name or id.")],
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Show one run: its recipe summary and every evaluation point."""
    with open_store(db) as store:
        info = store.get_run(run)
        points = store.points(info["id"])
    if json_:
        print_json({"run": info, "points": points})
        return
    recipe = info.get("recipe") or {}
    out.print(f"[bold]{info['name']}[/bold] (id {info['id']}, hash {info['recipe_hash'] or '-'}, "
              f"status {info['status']}, launcher {info['launcher'] or '-'}, hardware {info['hardware'] or '-'})")
    if recipe:
        loss, asy = recipe.get("loss", {}), recipe.get("async", {})
        out.print(f"loss {loss.get('type')} ({loss.get('aggregation')} aggregation), advantage "
                  f"{recipe.get('advantage', {}).get('normalization')}, head {recipe.get('precision', {}).get('lm_head')}, "
                  f"async {asy.get('mode')} k={asy.get('k')}, run folder {info.get('run_dir') or '-'}")
    from scalectl.display import Column, fitted_table

    # The gpu_hours field holds device-hours: CPU-hours for a run on CPU.
    device = (recipe.get("hardware") or {}).get("device", "")
    hours = "CPU-hours" if device == "cpu" else "GPU-hours"
    cols = [Column("step", keep=True), Column(hours, priority=5), Column("FLOPs", priority=4),
            Column("tokens", priority=1), Column("pass rate", keep=True), Column("trunc.", priority=6),
            Column("mean len", priority=3), Column("reward", priority=2), Column("entropy", priority=0)]
    out.print(fitted_table(None, cols, [
        [str(p["step"]), fmt(p["gpu_hours"], 4), fmt(p["flops"]), fmt(p["tokens"]), fmt(p["pass_rate"]),
         fmt(p["truncation_rate"]), fmt(p["mean_length"], 1), fmt(p["train_reward"]), fmt(p["entropy"])]
        for p in points], out.width))


@user_errors
def import_(
    file: Annotated[Path, typer.Argument(help="CSV or JSONL of points: pass_rate and compute (GPU-hours), step, flops, tokens, ...")],
    name: Annotated[str, typer.Option(help="Name of the new run.")],
    hardware: Annotated[str, typer.Option(help="Hardware class the GPU-hours were measured on.")] = "",
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Import evaluation points of a run made elsewhere (all rows or none)."""
    from scalectl.importer import import_points
    from scalectl.names import check_name

    check_name(name)
    with open_store(db, create=True) as store:
        run_id, n = import_points(store, file, name, hardware=hardware)
    if json_:
        print_json({"run_id": run_id, "name": name, "points": n})
    else:
        err.print(f"imported {n} points into run {name!r} (id {run_id})")


def register(app: typer.Typer) -> None:
    """Add ``runs``, ``show`` and ``import`` to the app."""
    app.command()(runs)
    app.command()(show)
    app.command("import")(import_)
