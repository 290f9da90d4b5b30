"""Bring your own curves: evaluation points from runs made elsewhere.

Reads CSV or JSON-lines files of points (verl, TRL, a paper's table) so that
fitting and comparison work on any run.  Columns: ``pass_rate`` and at least
one compute column (``gpu_hours``, or its alias ``compute``; ``flops``;
``tokens``; ``step``); optional ``truncation_rate``, ``mean_length``,
``train_reward``, ``entropy``, ``samples``.  A missing ``step`` is the row
number (0-based).  The whole file is checked before anything is written, and
written in one transaction: nothing is ever half-imported.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from scalectl.errors import UserError

COMPUTE_COLUMNS = ("gpu_hours", "flops", "tokens", "step")
OPTIONAL_FLOAT = ("truncation_rate", "mean_length", "train_reward", "entropy", "logprob_mismatch")
OPTIONAL_INT = ("samples", "samples_per_prompt")
ALIASES = {"compute": "gpu_hours"}


def read_points(path: str | Path) -> list[dict]:
    """Parse and check a CSV / JSONL file of points.

    Returns:
        Points with keys of the ``eval_points`` table, in file order.

    Raises:
        UserError: unreadable file, unknown format, or a bad row (with its
            1-based row number: the line in the file for JSONL, the data row
            for CSV).
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: file not found")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="") as fh:
            raw_rows = [(i + 1, row) for i, row in enumerate(csv.DictReader(fh))]
    elif suffix in (".jsonl", ".ndjson"):
        raw_rows = []
        for i, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}: row {i}: invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}: row {i}: expected a JSON object")
            raw_rows.append((i, row))
    else:
        raise UserError(f"{path}: unknown format {suffix!r}; expected .csv or .jsonl")
    if not raw_rows:
        raise UserError(f"{path}: no rows")
    points = [_check_row(path, n, row, index) for index, (n, row) in enumerate(raw_rows)]
    steps = [p["step"] for p in points]
    if len(set(steps)) != len(steps):
        dup = next(s for s in steps if steps.count(s) > 1)
        raise UserError(f"{path}: step {dup} appears more than once")
    return points


def _number(path: Path, n: int, key: str, value, kind: type):
    try:
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ValueError
        number = kind(float(value)) if kind is int else float(value)
    except (TypeError, ValueError):
        raise UserError(f"{path}: row {n}: {key} = {value!r} is not a number") from None
    if number != number or number < 0:
        raise UserError(f"{path}: row {n}: {key} = {value!r} must be a number >= 0")
    return number


def _check_row(path: Path, n: int, row: dict, index: int) -> dict:
    row = {ALIASES.get(k.strip(), k.strip()): v for k, v in row.items() if k is not None}
    allowed = set(COMPUTE_COLUMNS) | set(OPTIONAL_FLOAT) | set(OPTIONAL_INT) | {"pass_rate"}
    unknown = sorted(k for k in row if k not in allowed)
    if unknown:
        raise UserError(f"{path}: row {n}: unknown column(s) {', '.join(unknown)}; "
                        f"allowed: {', '.join(sorted(allowed | set(ALIASES)))}")
    if "pass_rate" not in row:
        raise UserError(f"{path}: row {n}: pass_rate is missing")
    if not any(k in row for k in COMPUTE_COLUMNS):
        raise UserError(f"{path}: row {n}: needs a compute column "
                        f"(one of compute, {', '.join(COMPUTE_COLUMNS)})")
    point: dict = {}
    for key, value in row.items():
        if value is None or value == "":
            continue
        kind = int if key in OPTIONAL_INT or key == "step" else float
        point[key] = _number(path, n, key, value, kind)
    if not 0 <= point["pass_rate"] <= 1:
        raise UserError(f"{path}: row {n}: pass_rate = {row['pass_rate']!r} must be in [0, 1]")
    if "truncation_rate" in point and not 0 <= point["truncation_rate"] <= 1:
        raise UserError(f"{path}: row {n}: truncation_rate = {row['truncation_rate']!r} must be in [0, 1]")
    point.setdefault("step", index)
    return point


def import_points(store, path: str | Path, name: str, *, hardware: str = "") -> tuple[int, int]:
    """Create run ``name`` holding the points of ``path``, in one transaction.

    Returns:
        (run id, number of points).

    Raises:
        UserError: a bad file (nothing written) or an existing run name.
    """
    points = read_points(path)
    with store.transaction():
        run_id = store.create_run(name, launcher="import", source=f"import:{Path(path).name}",
                                  hardware=hardware, status="completed")
        store.add_points(run_id, points)
    return run_id, len(points)
