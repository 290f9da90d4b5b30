"""``scalectl validate``: check recipe and setup files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from scalectl.commands.common import JsonOption, err, out, print_json, user_errors
from scalectl.errors import UserError


@user_errors
def validate(
    files: Annotated[list[Path] | None, typer.Argument(help="Recipe files to check.")] = None,
    setup: Annotated[Path | None, typer.Option(help="Setup file to merge under each recipe.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override KEY=VALUE (repeatable).")] = [],
    explain: Annotated[str | None, typer.Option(
        "--explain", metavar="KEY", help="What a recipe key (loss.clip_high) or section (loss) means: "
        "description, type, bounds, default, and its value in the recipe files given.")] = None,
    json_: JsonOption = False,
) -> None:
    """Print each recipe normalised (with its content hash), or its errors (exit 2).

    Also checks that model.path and data.source name what exists here (a
    checkpoint folder, a data file, a known builtin:, synthetic: or hf: source).  With --setup,
    also what a run would meet at start: the tokenizer of a checkpoint folder (its files, its
    EOS, a chat template when asked), the first rows of a prompt file (prompt and answer
    columns, tokens, lengths), then every row as the run reads it (the duplicates and the prompts
    longer than length.max_prompt_tokens it drops, the longest prompt, the split sizes), and keys
    that have no effect for the model or data (warned about).
    Without --setup each recipe is checked alone, while `scalectl run` merges the
    default setup under it: give that setup to see the hash a run will have.  A key
    the recipe sets wins over the setup's, --set over both; each value that replaced
    another layer's is printed as `# override: KEY = NEW from FILE overrides OLD from FILE`.
    A reward function of your own is named with the convention it is called with
    (`# reward: ...`: scalectl, verl or trl, as reward.convention says or recognised from its
    signature).  With --explain KEY, print what KEY means instead (with recipe files: its value in each).
    """
    import tomli_w

    from scalectl.job.preflight import check_inputs
    from scalectl.recipe.load import load

    files = files or []
    if explain is not None:
        return _explain(explain, files, setup, set_, json_)
    if not files:
        raise UserError("validate: give the recipe files to check, or --explain KEY")
    results, problems = [], []
    for path in files:
        try:
            notes: list[str] = []
            origins: dict[str, str] = {}
            overridden: list = []
            recipe = load(path, setup, set_, check_files=True, notes=notes, overridden=overridden, origins=origins)
            # alone: no run trains it; with a setup, every row of a prompt file read as the run reads it
            inputs = check_inputs(recipe, origins, whole_set=True) if setup is not None else None
            reward = _reward_convention(recipe)
        except UserError as exc:
            problems.append(str(exc))
            continue
        if inputs is not None and inputs.problems:
            problems += [f"{path}: {problem}" for problem in inputs.problems]
            continue
        results.append({"file": str(path), "hash": recipe.content_hash, "recipe": recipe.to_dict(),
                        "taken": notes, "warnings": inputs.warnings if inputs is not None else [],
                        "prompt_set": inputs.prompt_set if inputs is not None else None,
                        "overridden": [o.to_dict() for o in overridden],
                        "overridden_lines": [str(o) for o in overridden],
                        "reward_convention": reward,
                        **(_as_run(path, set_, recipe.to_dict()) if setup is None else {})})
    if json_:
        for r in results:
            r.pop("overridden_lines")
            r["reward_convention"] = r["reward_convention"] and {
                k: r["reward_convention"][k] for k in ("convention", "from")}
        print_json(results if not problems else {"ok": results, "errors": problems})
    else:
        for r in results:
            out.print(f"[bold]# {escape(r['file'])}[/bold]  hash {r['hash']}"
                      + (" (the recipe alone)" if "run_hash" in r else ""))
            if "run_hash" in r:
                out.print(_as_run_line(r), markup=False, soft_wrap=True, highlight=False)
            if r["reward_convention"] is not None:
                out.print(f"# reward: {r['reward_convention']['line']}", markup=False, soft_wrap=True,
                          highlight=False)
            for note in r["taken"]:
                out.print(f"# taken: {note}", markup=False, soft_wrap=True)
            for line in r.pop("overridden_lines"):
                out.print(f"# override: {line}", markup=False, soft_wrap=True)
            data = {k: v for k, v in r["recipe"].items()}
            out.print(tomli_w.dumps(_drop_none(data)), markup=False)
    for r in results:
        if r["prompt_set"] and not any(r["prompt_set"] in w for w in r["warnings"]):
            err.print(f"{r['file']}: {r['prompt_set']}", markup=False, soft_wrap=True)
        for warning in r["warnings"]:
            err.print(f"warning: {r['file']}: {warning}", markup=False, soft_wrap=True)
    if problems:
        raise UserError("\n".join(problems))
    err.print(f"{len(results)} file(s) valid")
    if setup is None and results:
        err.print("checked without a setup: the values printed are the recipe's own; `scalectl run` merges "
                  "the default setup under each recipe (the '# a run' line): pass it with --setup to see "
                  "what a run trains", markup=False)


def _reward_convention(recipe) -> dict | None:
    """How the recipe's reward function of the user's is called: ``{"convention": scalectl |
    verl | trl, "from": "reward.convention" | "signature", "line": the summary line}``, or None
    for the built-in checker.  The function was imported when the recipe's files were checked
    (:func:`scalectl.recipe.load.check_sources`), so this import finds it in ``sys.modules``.

    Raises:
        UserError: the function cannot be imported or fits no convention (as that check).
    """
    from scalectl.recipe.reward_function import BUILTIN_REWARD, convention_line, import_reward

    r = recipe.reward
    if r.function == BUILTIN_REWARD:
        return None
    convention = import_reward(r.function, r.convention)[1]
    return {"convention": convention, "from": "signature" if r.convention is None else "reward.convention",
            "line": convention_line(r.function, r.convention, convention)}


def _as_run(path: Path, overrides: list[str], alone: dict) -> dict:
    """What ``scalectl run`` makes of a recipe checked alone: the default setup merged under it.

    Returns ``{"run_setup": path, "run_hash": hash, "run_changes": [[key, alone, run], ...]}``
    (the hash ``scalectl recipes`` lists for a preset; the dotted keys whose values the
    setup changes), or ``{}`` when the merge is refused (``run`` would say why).
    """
    from scalectl.recipe.load import find_default_setup, load

    default = find_default_setup(path)
    try:
        merged = load(path, default, overrides)
    except UserError:
        return {}
    was, now = dict(_flat(alone)), dict(_flat(merged.to_dict()))
    changes = [[k, was.get(k), now.get(k)] for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]
    return {"run_setup": str(default), "run_hash": merged.content_hash, "run_changes": changes}


def _as_run_line(r: dict) -> str:
    """One comment line: the hash a run of the recipe has and what its default setup changes."""
    shown = ", ".join(f"{k} {was!r} -> {now!r}" for k, was, now in r["run_changes"])
    return (f"# a run (`scalectl run`, the hash `scalectl recipes` lists): hash {r['run_hash']} on the default "
            f"setup {r['run_setup']}, which changes {len(r['run_changes'])} value(s): {shown or 'none'}")


def _flat(d: dict, prefix: str = ""):
    """``(dotted key, value)`` for every leaf of a nested dict."""
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _explain(key: str, files: list[Path], setup: Path | None, overrides: list[str], json_: bool) -> None:
    """``validate --explain KEY``: the key's documentation, with its value in each recipe file."""
    from scalectl.recipe.explain import explain_lines, key_doc, recipe_values
    from scalectl.recipe.load import load

    doc = key_doc(key)
    values = []
    for path in files:
        origin: dict[str, str] = {}
        overridden: list = []
        data = load(path, setup, overrides, origins=origin, overridden=overridden).to_dict()
        values.append((str(path), recipe_values(doc, data, origin, overridden)))
    if json_:
        print_json({**doc.to_dict(), "values": [{"file": f, "key": k, "value": v, "from": w}
                                                for f, found in values for k, v, w in found]})
    else:
        for line in explain_lines(doc, values):
            out.print(line, markup=False, soft_wrap=True, highlight=False)


def _drop_none(d):
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    return d


def register(app: typer.Typer) -> None:
    """Add ``validate`` to the app."""
    app.command()(validate)
