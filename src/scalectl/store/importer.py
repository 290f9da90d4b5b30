"""Bring your own curves: evaluation points from runs made elsewhere.

Reads CSV or JSON-lines files of points (verl, TRL, a paper's table) so that
fitting and comparison work on any run.  Columns: ``pass_rate`` and at least
one compute column (``gpu_hours``, or its alias ``compute``; ``flops``;
``tokens``; ``step``); optional ``truncation_rate``, ``mean_length``,
``train_reward``, ``entropy``, ``logprob_mismatch``, ``samples``,
``samples_per_prompt``.  A missing ``step`` is the row number (0-based).

Every value is checked: numbers only (JSON ``true`` is not 1), finite, not
negative, whole numbers where the store keeps integers (``step``, ``tokens``,
``samples``, ``samples_per_prompt``, at most 2**63 - 1, SQLite's integer),
rates in [0, 1]; every CSV row has exactly the header's cells; compute
(GPU-hours, FLOPs, tokens) never goes down as the step goes up.  The whole
file is checked before anything is written, and written in one transaction:
nothing is ever half-imported.  A CSV saved with a byte-order mark (Excel's
"CSV UTF-8") is read as UTF-8.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from scalectl.errors import UserError
from scalectl.files import decode_utf8, read_limited

COMPUTE_COLUMNS = ("gpu_hours", "flops", "tokens", "step")
#: Compute columns that must not decrease along the steps.
MONOTONE_COLUMNS = ("gpu_hours", "flops", "tokens")
OPTIONAL_FLOAT = ("truncation_rate", "mean_length", "train_reward", "entropy", "logprob_mismatch")
INT_COLUMNS = ("step", "tokens", "samples", "samples_per_prompt")
RATE_COLUMNS = ("pass_rate", "truncation_rate")
#: Columns whose values may be negative (a reward, a log-prob gap).
SIGNED_COLUMNS = ("train_reward",)
ALIASES = {"compute": "gpu_hours"}
ALLOWED = frozenset(COMPUTE_COLUMNS) | set(OPTIONAL_FLOAT) | set(INT_COLUMNS) | {"pass_rate"}
#: Largest import file, in bytes.
MAX_IMPORT_BYTES = 256 << 20
#: SQLite's largest integer (signed 64-bit).
SQLITE_INT_MAX = 2**63 - 1


def read_points(path: str | Path) -> list[dict]:
    """Parse and check a CSV / JSONL file of points.

    Returns:
        Points with keys of the ``eval_points`` table, in file order.

    Raises:
        UserError: unreadable or not a regular file, larger than
            :data:`MAX_IMPORT_BYTES`, not UTF-8, unknown format, or a bad row
            (with its 1-based row number: the line in the file for JSONL, the
            data row for CSV) naming the column, the value and what is allowed.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl", ".ndjson"):
        raise UserError(f"{path}: unknown format {suffix!r}; expected .csv or .jsonl")
    text = decode_utf8(path, read_limited(path, MAX_IMPORT_BYTES, "import file"))
    raw_rows = _csv_rows(path, text) if suffix == ".csv" else _jsonl_rows(path, text)
    if not raw_rows:
        raise UserError(f"{path}: no rows")
    points = [_check_row(path, n, row, index) for index, (n, row) in enumerate(raw_rows)]
    rows_of = {}
    for (n, _), p in zip(raw_rows, points):
        if p["step"] in rows_of:
            raise UserError(f"{path}: row {n}: step {p['step']} appears more than once "
                            f"(first in row {rows_of[p['step']]})")
        rows_of[p["step"]] = n
    _check_monotone(path, points, [n for n, _ in raw_rows])
    return points


def _csv_rows(path: Path, text: str) -> list[tuple[int, dict]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            return []
        header = [h.strip() for h in header]
        if "" in header:
            raise UserError(f"{path}: the header has an empty column name (column {header.index('') + 1})")
        dup = next((h for h in header if header.count(h) > 1), None)
        if dup is not None:
            raise UserError(f"{path}: column {dup!r} appears twice in the header")
        rows = []
        for cells in reader:
            if not cells or all(not c.strip() for c in cells):
                continue
            n = len(rows) + 1
            if len(cells) != len(header):
                raise UserError(f"{path}: row {n} (line {reader.line_num}): {len(cells)} cell(s), "
                                f"the header has {len(header)} ({', '.join(header)})")
            rows.append((n, dict(zip(header, cells))))
    except csv.Error as exc:
        raise UserError(f"{path}: line {reader.line_num}: not valid CSV ({exc})") from None
    return rows


def _jsonl_rows(path: Path, text: str) -> list[tuple[int, dict]]:
    rows = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: row {i}: invalid JSON ({exc.msg})") from None
        except RecursionError:
            raise UserError(f"{path}: row {i}: nested too deeply to be a point") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}: row {i}: expected a JSON object, got {type(row).__name__}")
        rows.append((i, row))
    return rows


def _shown(value) -> str:
    text = "null" if value is None else json.dumps(value) if isinstance(value, bool) else repr(value)
    return text if len(text) <= 60 else text[:55] + "...'"


def _number(path: Path, n: int, key: str, value, whole: bool):
    """A cell as a finite number (an int for ``whole`` columns), or a UserError naming it.
    CSV cells are text; JSON values must be JSON numbers (not strings, not true/false)."""
    where = f"{path}: row {n}: {key} = {_shown(value)}"
    text_cells = path.suffix.lower() == ".csv"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or \
            (isinstance(value, str) and not text_cells):
        raise UserError(f"{where} is not a number")
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text) if whole and text.lstrip("+-").isdigit() else float(text)
        except ValueError:
            raise UserError(f"{where} is not a number") from None
    else:
        number = value
    if isinstance(number, float) and not math.isfinite(number):
        raise UserError(f"{where} is not a finite number")
    if number < 0 and key not in SIGNED_COLUMNS:
        raise UserError(f"{where} must be a number >= 0")
    if whole:
        if isinstance(number, float):
            if not number.is_integer():
                raise UserError(f"{where} must be a whole number")
            number = int(number)
        if number > SQLITE_INT_MAX:
            raise UserError(f"{where} is too large (at most {SQLITE_INT_MAX})")
    else:
        number = float(number)
    return number


def _check_row(path: Path, n: int, row: dict, index: int) -> dict:
    row = {ALIASES.get(k.strip(), k.strip()): v for k, v in row.items()}
    unknown = sorted(k for k in row if k not in ALLOWED)
    if unknown:
        raise UserError(f"{path}: row {n}: unknown column(s) {', '.join(unknown)}; "
                        f"allowed: {', '.join(sorted(ALLOWED | set(ALIASES)))}")
    point: dict = {}
    for key, value in row.items():
        if value is None or (isinstance(value, str) and not value.strip()):
            continue                              # an empty cell / null: no value
        point[key] = _number(path, n, key, value, key in INT_COLUMNS)
    if "pass_rate" not in point:
        raise UserError(f"{path}: row {n}: pass_rate is " + ("empty" if "pass_rate" in row else "missing"))
    if not any(k in point for k in COMPUTE_COLUMNS):
        raise UserError(f"{path}: row {n}: needs a compute column "
                        f"(one of compute, {', '.join(COMPUTE_COLUMNS)})")
    for key in RATE_COLUMNS:
        if key in point and not 0 <= point[key] <= 1:
            raise UserError(f"{path}: row {n}: {key} = {_shown(row[key])} must be in [0, 1]")
    point.setdefault("step", index)
    return point


def _check_monotone(path: Path, points: list[dict], rows: list[int]) -> None:
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
                    f"{path}: row {rows[i]}: {key} = {value} at step {points[i]['step']} is below "
                    f"{points[last][key]} at step {points[last]['step']} (row {rows[last]}): "
                    "compute must not go down as steps go up")
            last = i


def import_points(store, path: str | Path, name: str, *, hardware: str = "") -> tuple[int, int]:
    """Create run ``name`` holding the points of ``path``, in one transaction.

    Returns:
        (run id, number of points).

    Raises:
        UserError: a bad file (nothing written), an existing run name, a
            read-only or damaged store.
    """
    points = read_points(path)
    with store.transaction():
        run_id = store.create_run(name, launcher="import", source=f"import:{Path(path).name}",
                                  hardware=hardware, status="completed")
        store.add_points(run_id, points)
    return run_id, len(points)
