"""Bring your own curves: evaluation points from runs made elsewhere.

Reads what runs elsewhere leave behind (:mod:`scalectl.store.import_sources`: CSV or
JSON-lines files from verl, TRL or a paper's table, W&B CSV exports, TensorBoard event
folders, MLflow runs) so that fitting and comparison work on any run.

Columns become fields of the evaluation point (:func:`column_fields`), first match wins:

1. ``--map COLUMN=FIELD`` (``--tag TAG`` is ``--map TAG=pass_rate``);
2. a field's own name: ``pass_rate`` and the compute columns ``gpu_hours`` (or its alias
   ``compute``), ``flops``, ``tokens``, ``step``; ``truncation_rate``, ``mean_length``,
   ``train_reward``, ``entropy``, ``logprob_mismatch``, ``samples``,
   ``samples_per_prompt``, ``retired_prompts``, ``wall_seconds``;
3. a tracker's step and runtime: ``_step`` (W&B, TensorBoard, MLflow) is the step,
   ``_runtime`` (seconds) the wall-clock seconds;
4. ``eval/FIELD``, as scalectl's own trackers log the points (``eval/pass_rate``).

Any other column (``_timestamp``, ``train/loss``) is left out, and named in a note.  A row
without a pass rate (W&B's sparse rows, logged at training steps) is left out and counted
in a note; a source where no row has one is refused.  A missing ``step`` is the row number
(0-based).

GPU-hours come from a column, or from ``--hours-per-step`` (step x GPU-hours per step), or
from ``--devices`` (wall-clock seconds / 3600 x devices), and a note says which; without
any, the points keep the compute they have (steps, FLOPs, tokens) and ``fit`` uses that.

Every value is checked: numbers only (JSON ``true`` is not 1), finite, not
negative, whole numbers where the store keeps integers (``step``, ``tokens``,
``samples``, ``samples_per_prompt``, ``retired_prompts``, at most 2**63 - 1, SQLite's
integer), others within a float (an integer such as 10**400 is refused, naming its row and
column), rates in [0, 1]; every CSV row has exactly the header's cells; compute
(GPU-hours, FLOPs, tokens) never goes down as the step goes up.  The whole
source is checked before anything is written, and written in one transaction:
nothing is ever half-imported.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Sequence

from scalectl.errors import UserError
from scalectl.store.import_sources import (MAX_IMPORT_BYTES, RUNTIME_COLUMN, STEP_COLUMN, LongInt, Table,  # noqa: F401
                                           read_table)

COMPUTE_COLUMNS = ("gpu_hours", "flops", "tokens", "step")
#: Compute columns that must not decrease along the steps.
MONOTONE_COLUMNS = ("gpu_hours", "flops", "tokens")
OPTIONAL_FLOAT = ("truncation_rate", "mean_length", "train_reward", "entropy", "logprob_mismatch", "wall_seconds")
INT_COLUMNS = ("step", "tokens", "samples", "samples_per_prompt", "retired_prompts")
RATE_COLUMNS = ("pass_rate", "truncation_rate")
#: Columns whose values may be negative (a reward, a log-prob gap).
SIGNED_COLUMNS = ("train_reward",)
#: Other names of fields: scalectl's older ``compute``, and the step and runtime of a tracker's run.
ALIASES = {"compute": "gpu_hours", STEP_COLUMN: "step", RUNTIME_COLUMN: "wall_seconds"}
#: The prefix of scalectl's own tracker tags for evaluation points (``eval/pass_rate``).
TAG_PREFIX = "eval/"
ALLOWED = frozenset(COMPUTE_COLUMNS) | set(OPTIONAL_FLOAT) | set(INT_COLUMNS) | {"pass_rate"}
#: SQLite's largest integer (signed 64-bit).
SQLITE_INT_MAX = 2**63 - 1


def parse_maps(maps: Sequence[str] = (), tag: str | None = None) -> dict[str, str]:
    """``--map COLUMN=FIELD`` options (and ``--tag TAG``, the pass rate's column) as a dict.

    Raises:
        UserError: no ``=``, an empty column, a field that is not a point's, one column mapped twice.
    """
    out: dict[str, str] = {}
    pairs = [(m, *m.rsplit("=", 1)) if "=" in m else (m, m, None) for m in maps]
    if tag is not None:
        pairs.append((f"--tag {tag}", tag, "pass_rate"))
    for text, column, field in pairs:
        column = column.strip()
        if field is None or not column:
            raise UserError(f"--map {text!r}: expected COLUMN=FIELD (e.g. --map 'val/acc=pass_rate')")
        field = field.strip()
        if field not in ALLOWED:
            raise UserError(f"--map {text!r}: {field!r} is not a field of a point; allowed: "
                            f"{', '.join(sorted(ALLOWED))}")
        if column in out and out[column] != field:
            raise UserError(f"--map: column {column!r} is mapped twice ({out[column]}, {field})")
        out[column] = field
    return out


def _field_rule(column: str, maps: dict[str, str]) -> tuple[int, str] | None:
    """(priority, field) of a column: lower wins (the module docstring's order), None: not a field."""
    if column in maps:
        return 0, maps[column]
    if column in ALLOWED:
        return 1, column
    if column in ALIASES:
        return 2, ALIASES[column]
    if column.startswith(TAG_PREFIX) and column[len(TAG_PREFIX):] in ALLOWED:
        return 3, column[len(TAG_PREFIX):]
    return None


def column_fields(columns: Sequence[str], maps: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Which column gives each field, and the notes about the columns left out.

    Returns:
        (``{column: field}`` of the columns read, notes); of two columns that name one field the
        first by the rules of the module docstring is read and the other named in a note.

    Raises:
        UserError: a ``--map`` column the source does not have.
    """
    missing = [c for c in maps if c not in columns]
    if missing:
        raise UserError(f"--map: no column {', '.join(map(repr, missing))} here; columns: "
                        f"{', '.join(columns[:30])}")
    chosen: dict[str, tuple[int, str]] = {}
    shadowed, unknown = [], []
    for column in columns:
        rule = _field_rule(column, maps)
        if rule is None:
            unknown.append(column)
            continue
        held = chosen.get(rule[1])
        if held is not None and held[0] <= rule[0]:
            shadowed.append((column, rule[1], held[1]))
            continue
        if held is not None:
            shadowed.append((held[1], rule[1], column))
        chosen[rule[1]] = (rule[0], column)
    notes = []
    if unknown:
        notes.append(f"left out {len(unknown)} column(s) that are not fields of a point: {_listed(unknown)} "
                     "(--map COLUMN=FIELD reads one)")
    notes += [f"left out column {c!r}: {f} comes from column {by!r}" for c, f, by in shadowed]
    return {column: field for field, (_, column) in chosen.items()}, notes


def _listed(names: list[str], at_most: int = 12) -> str:
    shown = ", ".join(names[:at_most])
    return shown + (f" and {len(names) - at_most} more" if len(names) > at_most else "")


def _shown(value) -> str:
    """A cell as messages show it: JSON's words for null and booleans, an integer of more than
    20 digits in scientific notation with its digit count (``1.000e+400 (401 digits)``, quoted
    when it is CSV text), else its repr, cut at 60 characters."""
    if isinstance(value, LongInt):
        text = value.digits
    elif isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        text = value.strip()
    else:
        text = None
    if text is not None:
        sign, digits = ("-" if text.startswith("-") else ""), text.lstrip("+-").lstrip("0") or "0"
        if len(digits) > 20:
            shown = f"{sign}{digits[0]}.{digits[1:4]:0<3}e+{len(digits) - 1} ({len(digits)} digits)"
            return repr(shown) if isinstance(value, str) else shown
    text = "null" if value is None else json.dumps(value) if isinstance(value, bool) else repr(value)
    if len(text) <= 60:
        return text
    return text[:55] + ("...'" if isinstance(value, str) else "...")


def _number(where: str, key: str, value, whole: bool, text_cells: bool, column: str | None = None):
    """A cell as a finite number (an int for ``whole`` columns), or a UserError naming it (and
    ``column``, when it is not named ``key``).
    CSV cells are text; typed cells (JSON, trackers) must be numbers (not strings, not true/false).
    Integers beyond a float (10**400) are refused in float columns, beyond SQLite's integer in
    whole ones."""
    where = f"{where}: {key} = {_shown(value)}"
    named = f" (column {column!r})" if column is not None and column != key else ""

    def refused(why: str) -> UserError:
        return UserError(f"{where} {why}{named}")

    too_large = f"is too large (at most {SQLITE_INT_MAX})" if whole else \
        f"is too large for a float (at most {sys.float_info.max:.2g})"
    if isinstance(value, LongInt):
        raise refused(too_large)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or \
            (isinstance(value, str) and not text_cells):
        raise refused("is not a number")
    if isinstance(value, str):
        text = value.strip()
        digits = text.lstrip("+-").isdigit()
        try:
            number = int(text) if whole and digits else float(text)
        except ValueError:
            if digits:                   # beyond Python's reading of int text (4300 digits)
                raise refused(too_large) from None
            raise refused("is not a number") from None
        if isinstance(number, float) and math.isinf(number) and text.lstrip("+-").lower() not in ("inf", "infinity"):
            raise refused(too_large)     # a literal beyond a float: float() gives inf
    else:
        number = value
    if isinstance(number, float) and not math.isfinite(number):
        raise refused("is not a finite number")
    if number < 0 and key not in SIGNED_COLUMNS:
        raise refused("must be a number >= 0")
    if whole:
        if isinstance(number, float):
            if not number.is_integer():
                raise refused("must be a whole number")
            number = int(number)
        if number > SQLITE_INT_MAX:
            raise refused(too_large)
    else:
        try:
            number = float(number)
        except OverflowError:            # an int beyond a float
            raise refused(too_large) from None
    return number


def _check_row(where: str, row: dict, fields: dict[str, str], index: int, text_cells: bool,
               need_compute: bool = True) -> dict | None:
    """The point of one row (its cells of the read columns checked), or None when it has no pass rate.
    ``need_compute``: a row must hold a compute column (no ``--hours-per-step``)."""
    point: dict = {}
    for column, field in fields.items():
        value = row.get(column)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue                              # an empty cell / null: no value
        point[field] = _number(f"{where}", field, value, field in INT_COLUMNS, text_cells, column)
    if "pass_rate" not in point:
        return None
    if need_compute and not any(k in point for k in COMPUTE_COLUMNS):
        raise UserError(f"{where}: needs a compute column (one of compute, {', '.join(COMPUTE_COLUMNS)}, "
                        f"{STEP_COLUMN}), or --hours-per-step")
    for key in RATE_COLUMNS:
        if key in point and not 0 <= point[key] <= 1:
            column = next(c for c, f in fields.items() if f == key)
            raise UserError(f"{where}: {key} = {_shown(row[column])} must be in [0, 1]")
    point.setdefault("step", index)
    return point


def _check_monotone(what: str, points: list[dict], labels: list[str]) -> None:
    """Compute (GPU-hours, FLOPs, tokens) must not go down as the step goes up."""
    order = sorted(range(len(points)), key=lambda i: points[i]["step"])
    for key in MONOTONE_COLUMNS:
        last = None
        for i in order:
            value = points[i].get(key)
            if value is None:
                continue
            if last is not None and value < points[last][key]:
                raise UserError(
                    f"{what}: {labels[i]}: {key} = {value} at step {points[i]['step']} is below "
                    f"{points[last][key]} at step {points[last]['step']} ({labels[last]}): "
                    "compute must not go down as steps go up")
            last = i


def _gpu_hours(what: str, points: list[dict], fields: dict[str, str], hours_per_step: float | None,
               devices: int | None) -> str:
    """Fill in GPU-hours by the rule asked for; return the note that says where compute came from.

    Raises:
        UserError: a rule given beside a GPU-hours column, both rules, a bad number, no runtime
            for ``devices``.
    """
    column = next((c for c, f in fields.items() if f == "gpu_hours"), None)
    given = [o for o, v in (("--hours-per-step", hours_per_step), ("--devices", devices)) if v is not None]
    if len(given) > 1:
        raise UserError("give one of --hours-per-step and --devices, not both")
    if given and column is not None:
        raise UserError(f"{what}: GPU-hours come from column {column!r}; {given[0]} would replace them "
                        f"(leave it out, or --map {column}=... another field)")
    others = [f"{f} from column {c!r}" for c, f in fields.items() if f in ("flops", "tokens")]
    if hours_per_step is not None:
        if not (math.isfinite(hours_per_step) and hours_per_step > 0):
            raise UserError(f"--hours-per-step {hours_per_step!r} must be a number > 0")
        for p in points:
            p["gpu_hours"] = p["step"] * hours_per_step
        rule = f"gpu_hours = step x {hours_per_step:g} GPU-hours per step (--hours-per-step)"
    elif devices is not None:
        if devices < 1:
            raise UserError(f"--devices {devices} must be >= 1")
        runtime = next((c for c, f in fields.items() if f == "wall_seconds"), None)
        lacking = [p["step"] for p in points if p.get("wall_seconds") is None]
        if runtime is None or lacking:
            raise UserError(f"{what}: --devices needs the runtime of every point (a _runtime or wall_seconds column, "
                            f"or --map COLUMN=wall_seconds); " + ("there is none" if runtime is None else
                            f"step {lacking[0]} has none"))
        for p in points:
            p["gpu_hours"] = p["wall_seconds"] / 3600 * devices
        rule = f"gpu_hours = {runtime} (seconds) / 3600 x {devices} device(s) (--devices)"
    elif column is not None:
        rule = f"gpu_hours from column {column!r}"
    else:
        rule = ("no GPU-hours (no column; --hours-per-step or --devices would give them): "
                "the points keep " + ", ".join(["step"] + [o.split()[0] for o in others]))
        return "compute: " + rule
    return "compute: " + "; ".join([rule] + others)


def read_points(source: str | Path, *, maps: Sequence[str] = (), tag: str | None = None, run: str | None = None,
                hours_per_step: float | None = None, devices: int | None = None,
                notes: list[str] | None = None) -> list[dict]:
    """Parse and check the points of a source (:func:`scalectl.store.import_sources.read_table`).

    Args:
        source: a CSV/JSONL file, a TensorBoard event folder or file, an MLflow tracking store.
        maps: ``COLUMN=FIELD`` (``--map``); ``tag``: the pass rate's column (``--tag``).
        run: the MLflow run (id or name).
        hours_per_step: GPU-hours per step; ``devices``: devices of the run (x its runtime).
        notes: when given, receives what was left out and where compute came from.

    Returns:
        Points with keys of the ``eval_points`` table, in source order.

    Raises:
        UserError: an unreadable source (see ``read_table``), a bad option, no row with a pass
            rate, a step given twice (two rows of a file; a tracker's tag or metric read here
            logged twice at one step with different values), or a bad cell (with its row: the
            line of a JSONL file, the data row of a CSV, the step of a tracker's run) naming the
            field, its column, the value and what is allowed.
    """
    fields_map = parse_maps(maps, tag)
    table = read_table(source, run=run)
    what = table.what
    if not table.rows:
        raise UserError(f"{what}: no rows")
    fields, said = column_fields(table.columns, fields_map)
    if "pass_rate" not in fields.values():
        raise UserError(f"{what}: no pass_rate column (columns: {_listed(table.columns, 30)}); name it with "
                        "--tag COLUMN or --map COLUMN=pass_rate")
    for (label, column), values in table.repeats.items():
        if column in fields:
            raise UserError(f"{what}: {label}: {column!r} appears more than once at this step, with different values "
                            f"({', then '.join(map(repr, values))}): a point holds one value per step (a run "
                            "restarted in its folder logs its steps again: import the events of one attempt)")
    kept, labels, sparse = [], [], 0
    for index, (label, row) in enumerate(table.rows):
        point = _check_row(f"{what}: {label}", row, fields, index, table.text_cells, hours_per_step is None)
        if point is None:
            sparse += 1
            continue
        kept.append(point)
        labels.append(label)
    if not kept:
        raise UserError(f"{what}: no row has a pass rate ({len(table.rows)} row(s), pass_rate from column "
                        f"{next(c for c, f in fields.items() if f == 'pass_rate')!r})")
    if sparse:
        said.append(f"left out {sparse} of {len(table.rows)} rows without a pass rate (logged between evaluations)")
    first: dict[int, str] = {}
    for label, p in zip(labels, kept):
        if p["step"] in first:
            raise UserError(f"{what}: {label}: step {p['step']} appears more than once (first in {first[p['step']]})")
        first[p["step"]] = label
    said.append(_gpu_hours(what, kept, fields, hours_per_step, devices))
    _check_monotone(what, kept, labels)
    if notes is not None:
        notes.extend(said)
    return kept


def import_points(store, source: str | Path, name: str, *, hardware: str = "", notes: list[str] | None = None,
                  **options) -> tuple[int, int]:
    """Create run ``name`` holding the points of ``source``, in one transaction.

    Args:
        options: those of :func:`read_points` (``maps``, ``tag``, ``run``, ``hours_per_step``, ``devices``).
        notes: receives :func:`read_points`' notes.

    Returns:
        (run id, number of points).

    Raises:
        UserError: a bad source (nothing written), an existing run name, a
            read-only or damaged store.
    """
    points = read_points(source, notes=notes, **options)
    label = Path(str(source)).name if not str(source).startswith(("sqlite:", "http")) else str(source)
    with store.transaction():
        run_id = store.create_run(name, launcher="import", source=f"import:{label}",
                                  hardware=hardware, status="completed")
        store.add_points(run_id, points)
    return run_id, len(points)
