"""Where imported curves come from: the tables of cells that :mod:`scalectl.store.importer` checks.

Each reader turns one source into a :class:`Table`: rows of ``column -> cell``, each with the
label its errors name (``row 3`` of a file, ``step 40`` of a tracker's run), and where the
source came from.

* a ``.csv`` file: a header and rows of text cells (scalectl's own columns, a W&B export of
  a run's history with ``_step``, ``_runtime``, ``_timestamp`` and one column per logged key,
  a verl or TRL log); a byte-order mark (Excel's "CSV UTF-8") is dropped;
* a ``.jsonl`` / ``.ndjson`` file: one JSON object per line, JSON numbers as cells (an integer
  of more digits than Python reads as an int, as a :class:`LongInt`); a key given twice in one
  object is refused, as a CSV column given twice is;
* a TensorBoard event folder (``events.out.tfevents.*`` files, as ``torch.utils.tensorboard``
  and scalectl's own ``tensorboard`` backend write them), or one event file: a row per
  step holding every scalar tag logged at it, ``_step`` and ``_runtime`` (seconds since
  the first event), read with TensorBoard's own ``EventAccumulator`` (a tag logged twice at
  one step with different values, as a run restarted in its folder logs it, is kept in
  :attr:`Table.repeats`);
* an MLflow run of a tracking store (a tracking URI such as ``sqlite:///mlflow.db``, or a
  ``mlruns`` folder): a row per step holding every metric's value at it, ``_step`` and
  ``_runtime`` (seconds since the run started), read with ``mlflow.tracking.MlflowClient`` (a
  metric logged twice at one step with different values: :attr:`Table.repeats`).

TensorBoard and MLflow are optional extras (``scalectl[tensorboard]``, ``scalectl[mlflow]``),
imported only when such a source is read.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from scalectl.errors import UserError
from scalectl.files import decode_utf8, read_limited

#: Largest import file, in bytes.
MAX_IMPORT_BYTES = 256 << 20
#: Tracking URI schemes that name an MLflow tracking store.
MLFLOW_SCHEMES = ("sqlite:", "postgresql", "mysql", "mssql", "http://", "https://", "file:", "databricks")
#: How a TensorBoard event file is named.
EVENTS_GLOB = "events.out.tfevents.*"
#: The columns a tracker's run gets besides its logged keys: its step and its runtime (seconds).
STEP_COLUMN, RUNTIME_COLUMN = "_step", "_runtime"


@dataclass(frozen=True)
class Table:
    """Cells of one source, before any check.

    Attributes:
        rows: ``(label, {column: cell})`` in source order; the label names the row in errors
            (``row 3``, ``step 40``).
        columns: every column name, in first-seen order.
        kind: ``csv``, ``jsonl``, ``tensorboard`` or ``mlflow``.
        text_cells: cells are text to parse (CSV), not typed values.
        what: the source for messages (a path, ``MLflow run NAME (ID) of URI``).
    """

    rows: list[tuple[str, dict]]
    columns: list[str]
    kind: str
    text_cells: bool
    what: str
    #: A tracker's run: ``(label, column) -> values`` where one step holds a tag (metric) logged
    #: with different values, in step order (the row keeps the last); the importer refuses those
    #: of the columns it reads.  Empty for files (a step given twice is two rows there).
    repeats: dict = field(default_factory=dict)


def is_tracking_uri(source: str) -> bool:
    """Whether ``source`` names an MLflow tracking store by URI (``sqlite:///mlflow.db``)."""
    return str(source).startswith(MLFLOW_SCHEMES)


def read_table(source: str | Path, *, run: str | None = None) -> Table:
    """The cells of ``source``: a CSV or JSONL file, a TensorBoard event folder or file, or an
    MLflow tracking store (a URI, or a ``mlruns`` folder) with ``run`` (its id or name;
    default: the store's only run).

    Raises:
        UserError: a missing or unreadable source, an unknown format, a folder holding neither
            event files nor MLflow runs, a missing extra, no such MLflow run.
    """
    text = str(source)
    if is_tracking_uri(text):
        return mlflow_table(text, run)
    path = Path(source)
    if path.is_dir():
        if _event_files(path) or _event_subfolders(path):
            return tensorboard_table(path)
        if any(path.glob("*/meta.yaml")) or any(path.glob("*/*/meta.yaml")):
            return mlflow_table(str(path.resolve()), run)
        raise UserError(f"{path}: is a folder holding neither TensorBoard event files ({EVENTS_GLOB}) nor MLflow "
                        "runs (a mlruns folder); give a .csv or .jsonl file, an event folder or a tracking URI")
    if path.name.startswith("events.out.tfevents."):
        return tensorboard_table(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl", ".ndjson"):
        raise UserError(f"{path}: unknown format {suffix!r}; expected a .csv or .jsonl file, a TensorBoard event "
                        "folder, or an MLflow tracking URI (sqlite:///mlflow.db)")
    data = decode_utf8(path, read_limited(path, MAX_IMPORT_BYTES, "import file"))
    if suffix == ".csv":
        rows, columns = _csv_rows(path, data)
        return Table(rows, columns, "csv", True, str(path))
    rows = _jsonl_rows(path, data)
    return Table(rows, list(dict.fromkeys(k for _, r in rows for k in r)), "jsonl", False, str(path))


# --------------------------------------------------------------------------- files


def _csv_rows(path: Path, text: str) -> tuple[list[tuple[str, dict]], list[str]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            return [], []
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
            rows.append((f"row {n}", dict(zip(header, cells))))
    except csv.Error as exc:
        raise UserError(f"{path}: line {reader.line_num}: not valid CSV ({exc})") from None
    return rows, header


class LongInt:
    """A JSON integer of more digits than Python reads as an int (4300, ``sys.set_int_max_str_digits``),
    kept as its text so that the check of its cell can name it (it is too large for any field).

    Attributes:
        digits: the integer as written (``-`` and digits).
    """

    def __init__(self, digits: str):
        self.digits = digits

    def __repr__(self) -> str:
        return f"LongInt({self.digits[:20]}...)"


def _json_int(text: str):
    """``parse_int`` of :func:`json.loads`: the int, or a :class:`LongInt` beyond Python's reading."""
    try:
        return int(text)
    except ValueError:
        return LongInt(text)


class _DuplicateKey(ValueError):
    """A JSON object names one key twice (``key``; json itself would keep the last value)."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``object_pairs_hook`` of :func:`json.loads`: the object as a dict, keys stripped of
    surrounding whitespace (as the columns are matched).

    Raises:
        _DuplicateKey: a key given twice (also as ``" a"`` beside ``"a"``), at any depth.
    """
    out: dict = {}
    for key, value in pairs:
        name = key.strip()
        if name in out:
            raise _DuplicateKey(name)
        out[name] = value
    return out


def _jsonl_rows(path: Path, text: str) -> list[tuple[str, dict]]:
    rows = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line, object_pairs_hook=_unique_keys, parse_int=_json_int)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: row {i}: invalid JSON ({exc.msg})") from None
        except _DuplicateKey as exc:
            raise UserError(f"{path}: row {i} (line {i}): key {exc.key!r} appears twice in one object (JSON would "
                            "keep the last value); give each key once") from None
        except RecursionError:
            raise UserError(f"{path}: row {i}: nested too deeply to be a point") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}: row {i}: expected a JSON object, got {type(row).__name__}")
        rows.append((f"row {i}", row))
    return rows


# --------------------------------------------------------------------------- trackers


def _by_step(events: dict[str, list[tuple[int, float, float]]], start: float | None
             ) -> tuple[list[tuple[str, dict]], dict[tuple[str, str], list[float]]]:
    """Rows of ``tag -> [(step, seconds, value)]``: one per step, ``_step`` and ``_runtime``
    (seconds since ``start``, default the first event) beside the tags logged at it; and the
    repeats, ``(label, tag) -> [values]`` where a tag holds different values at one step (in the
    order logged; the row keeps the last), in step order.  A value logged again unchanged is no
    repeat."""
    rows: dict[int, dict] = {}
    times: dict[int, float] = {}
    repeats: dict[tuple[int, str], list[float]] = {}
    for tag, series in events.items():
        for step, seconds, value in sorted(series, key=lambda e: e[1]):
            row = rows.setdefault(step, {})
            if tag in row and not (row[tag] == value or (math.isnan(row[tag]) and math.isnan(value))):
                held = repeats.setdefault((step, tag), [row[tag]])
                if value not in held:
                    held.append(value)
            row[tag] = value
            times[step] = max(times.get(step, seconds), seconds)
    if not rows:
        return [], {}
    origin = min(times.values()) if start is None else start
    table = [(f"step {step}", {STEP_COLUMN: step, RUNTIME_COLUMN: max(times[step] - origin, 0.0), **rows[step]})
             for step in sorted(rows)]
    return table, {(f"step {step}", tag): values for (step, tag), values in sorted(repeats.items(),
                                                                                   key=lambda kv: kv[0][0])}


def _event_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob(EVENTS_GLOB) if p.is_file())


def _event_subfolders(folder: Path) -> list[Path]:
    return sorted({p.parent for p in folder.rglob(EVENTS_GLOB) if p.is_file() and p.parent != folder})


def tensorboard_table(path: Path) -> Table:
    """The scalars of a TensorBoard event folder (or one event file), a row per step.

    A folder without event files of its own but with exactly one subfolder that has some
    (``runs/NAME`` holding ``tensorboard/``) is read there.  Scalars written as summaries
    (``add_scalar``) and as scalar tensors (TF2 summaries) are both read.

    Raises:
        UserError: tensorboard not installed, several event subfolders, no scalars.
    """
    try:
        from tensorboard.backend.event_processing import event_accumulator
        from tensorboard.util import tensor_util
    except ImportError:
        raise UserError(f"{path}: reading TensorBoard event files needs tensorboard "
                        "(pip install 'scalectl[tensorboard]')") from None
    if path.is_dir() and not _event_files(path):
        subs = _event_subfolders(path)
        if len(subs) > 1:
            raise UserError(f"{path}: holds {len(subs)} TensorBoard runs ({', '.join(str(s) for s in subs[:5])}); "
                            "import one folder at a time")
        path = subs[0]
    acc = event_accumulator.EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    try:
        acc.Reload()
    except Exception as exc:  # noqa: BLE001 - a damaged event file: TensorBoard raises several types
        raise UserError(f"{path}: not readable as TensorBoard event files ({exc})") from None
    tags = acc.Tags()
    events = {tag: [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)] for tag in tags.get("scalars", [])}
    for tag in tags.get("tensors", []):
        values = []
        for e in acc.Tensors(tag):
            array = tensor_util.make_ndarray(e.tensor_proto)
            if array.size == 1 and array.dtype.kind in "fiu":
                values.append((e.step, e.wall_time, float(array.reshape(()))))
        if values:
            events.setdefault(tag, values)
    rows, repeats = _by_step(events, None)
    if not rows:
        raise UserError(f"{path}: the TensorBoard event files hold no scalars")
    return Table(rows, [STEP_COLUMN, RUNTIME_COLUMN, *events], "tensorboard", False, str(path), repeats)


def _mlflow_run(client, uri: str, run: str | None):
    """The MLflow run named by id or name (``run``), or the store's only run."""
    from mlflow.exceptions import MlflowException

    if run:
        try:
            return client.get_run(run)
        except MlflowException:
            pass
    experiments = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(experiments, max_results=1000) if experiments else []
    if run:
        named = [r for r in found if r.info.run_name == run]
        if len(named) == 1:
            return named[0]
        if len(named) > 1:
            raise UserError(f"{uri}: {len(named)} MLflow runs are named {run!r}; give its run id "
                            f"({', '.join(r.info.run_id for r in named[:5])})")
    elif len(found) == 1:
        return found[0]
    listed = ", ".join(f"{r.info.run_name} ({r.info.run_id})" for r in found[:10]) or "none"
    what = f"no MLflow run {run!r}" if run else f"{len(found)} MLflow runs"
    raise UserError(f"{uri}: {what}; name one with --run ID-OR-NAME (runs: {listed})")


def mlflow_table(uri: str, run: str | None) -> Table:
    """Every metric of an MLflow run, a row per step.

    Raises:
        UserError: mlflow not installed, a store that cannot be opened, no such run (naming the
            runs there), a run without metrics.
    """
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise UserError(f"{uri}: reading MLflow runs needs mlflow (pip install 'scalectl[mlflow]')") from None
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise UserError(f"{uri}: no such MLflow store (file {uri[len('sqlite:///'):]} not found)")
    try:
        client = MlflowClient(tracking_uri=uri)
        found = _mlflow_run(client, uri, run)
        history = {key: [(m.step, m.timestamp / 1000, m.value) for m in client.get_metric_history(found.info.run_id, key)]
                   for key in found.data.metrics}
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - MLflow raises its own and SQLAlchemy's errors
        raise UserError(f"{uri}: cannot read the MLflow store ({type(exc).__name__}: {exc})") from None
    what = f"MLflow run {found.info.run_name} ({found.info.run_id}) of {uri}"
    start = found.info.start_time / 1000 if found.info.start_time else None
    rows, repeats = _by_step(history, start)
    if not rows:
        raise UserError(f"{what}: no metrics logged")
    return Table(rows, [STEP_COLUMN, RUNTIME_COLUMN, *history], "mlflow", False, what, repeats)
