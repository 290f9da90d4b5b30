"""Trackers: a run's per-step metrics and evaluation points in TensorBoard, W&B, MLflow or JSON lines.

The ``[logging]`` section of a recipe or setup (:class:`scalectl.recipe.schema.Logging`)
names the backends.  :func:`tracking` wraps the loop's reporter
(:class:`scalectl.rl.loop.Reporter`) in a :class:`TrackingReporter` that sends

* every optimiser step's numeric metrics as ``train/<name>`` (loss,
  clip_fraction, entropy, logprob_mismatch, grad_norm, lr, reward, truncation_rate,
  ... : whatever the step reports), and
* every evaluation point's numeric fields as ``eval/<name>`` (pass_rate,
  truncation_rate, mean_length, gpu_hours, flops, tokens, ...),

both at the optimiser step, through each library's own API, with the run's
name, recipe hash and normalised recipe as its configuration.  None of the
libraries is a dependency of scalectl: each backend comes with an extra
(``pip install 'scalectl[tensorboard]'``), and a missing one is named before
the run starts (:func:`check_installed`).

The loop itself keeps writing ``RUN_DIR/steps.jsonl`` and the store; these
trackers are copies for the tools people already watch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from scalectl.errors import UserError

#: backend -> (module it imports, the scalectl extra that installs it); jsonl needs nothing.
BACKENDS: dict[str, tuple[str, str] | None] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "jsonl": None,
}
#: Where the file-based backends write, inside the run folder.
TENSORBOARD_DIR = "tensorboard"
JSONL_FILE = "metrics.jsonl"
#: Ids a tracker keeps across resumes (the MLflow run id), inside the run folder.
STATE_FILE = "trackers.json"


def missing(backends) -> list[str]:
    """The backends whose library is not installed (looked up without importing it)."""
    return [b for b in backends if BACKENDS[b] is not None and not _importable(BACKENDS[b][0])]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):      # ValueError: sys.modules[module] is None (import blocked)
        return False


def check_installed(logging) -> None:
    """Raise if a backend of ``logging`` (a :class:`scalectl.recipe.schema.Logging`) lacks its library.

    Raises:
        UserError: naming the backend, the ``logging.backends`` key and the extra to install.
    """
    lacking = missing(logging.backends)
    if lacking:
        extras = ",".join(BACKENDS[b][1] for b in lacking)
        raise UserError(f"logging.backends = {list(logging.backends)}: {', '.join(lacking)} "
                        f"{'is' if len(lacking) == 1 else 'are'} not installed; "
                        f"install with: pip install 'scalectl[{extras}]'")


def scalars(metrics: dict, prefix: str) -> dict[str, float]:
    """The numeric, finite entries of ``metrics`` (booleans as 0/1) as ``prefix/name``;
    ``step`` and non-numbers (lists, strings, None) are left out."""
    out = {}
    for key, value in metrics.items():
        if key == "step" or value is None or isinstance(value, (str, list, dict, tuple)):
            continue
        if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            out[f"{prefix}/{key}"] = float(value)
    return out


def flat(data: dict, prefix: str = "") -> dict:
    """A nested table as dotted keys (``loss.type``), for trackers whose config is flat."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@dataclass(frozen=True)
class RunInfo:
    """What every tracker is told about the run: its name, folder, recipe and a stable key."""

    name: str
    run_dir: Path
    recipe: dict
    recipe_hash: str
    key: str          # stable across resumes and unique per store and run (W&B run id)

    @property
    def config(self) -> dict:
        """The configuration trackers record: run name, recipe hash and the normalised recipe."""
        return {"run": self.name, "recipe_hash": self.recipe_hash, "recipe": self.recipe}


def run_key(name: str, db: str, run_id: int) -> str:
    """``<name>-<8 hex>``: the run's name (characters W&B ids accept) and a digest of store and id."""
    digest = hashlib.sha256(f"{Path(db).resolve()}\0{run_id}".encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '-', name)[:48]}-{digest}"


def _read_state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_state(run_dir: Path, **values) -> None:
    state = {**_read_state(run_dir), **values}
    tmp = run_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(run_dir / STATE_FILE)


# --------------------------------------------------------------------------- backends
#
# Each backend: open(info, first_step, resumed), log(step, scalars), close(status);
# status is "completed", "cancelled" or "failed".


class TensorBoardTracker:
    """Event files in ``RUN_DIR/tensorboard`` (``torch.utils.tensorboard.SummaryWriter``);
    ``tensorboard --logdir runs`` shows every run.  The config goes in as a text summary.
    On a resume, events logged after the checkpoint's step are purged (they are logged again)."""

    def open(self, info: RunInfo, first_step: int, resumed: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(info.run_dir / TENSORBOARD_DIR),
                                    purge_step=first_step + 1 if resumed else None)
        if not resumed:
            text = (f"run **{info.name}**, recipe hash `{info.recipe_hash}`\n\n"
                    "```json\n" + json.dumps(info.recipe, indent=2) + "\n```")
            self.writer.add_text("config", text, global_step=first_step)

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run (``wandb.init``) named like the scalectl run, its id stable across resumes
    (``resume="allow"``), files under ``RUN_DIR/wandb``; every metric is plotted against
    ``step`` (``define_metric``), so a resumed run may log a step again."""

    def __init__(self, logging):
        self.logging = logging

    def open(self, info: RunInfo, first_step: int, resumed: bool) -> None:
        import wandb

        self.run = wandb.init(project=self.logging.project, entity=self.logging.wandb_entity,
                              name=info.name, id=info.key, resume="allow", dir=str(info.run_dir),
                              mode=self.logging.wandb_mode, config=info.config, tags=[info.recipe_hash],
                              job_type="train", reinit="create_new")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log({"step": step, **values})

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "completed" else 1)


class MlflowTracker:
    """An MLflow run (``MlflowClient``) in experiment ``logging.project``: the recipe as
    params (dotted keys) and as the artifact ``recipe.json``, the hash as a tag; the run
    id is kept in ``RUN_DIR/trackers.json`` so a resume continues the same MLflow run."""

    STATUS = {"completed": "FINISHED", "cancelled": "KILLED", "failed": "FAILED"}

    def __init__(self, logging):
        self.logging = logging

    def open(self, info: RunInfo, first_step: int, resumed: bool) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.logging.mlflow_tracking_uri)
        known = _read_state(info.run_dir).get("mlflow_run_id")
        if resumed and known:
            self.run_id = known
            self.client.update_run(known, status="RUNNING")
            return
        exp = self.client.get_experiment_by_name(self.logging.project)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(self.logging.project)
        run = self.client.create_run(exp_id, run_name=info.name,
                                     tags={"scalectl.run": info.name, "scalectl.recipe_hash": info.recipe_hash})
        self.run_id = run.info.run_id
        _write_state(info.run_dir, mlflow_run_id=self.run_id)
        params = [Param(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in flat(info.recipe).items()]
        for i in range(0, len(params), 100):          # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.client.log_dict(self.run_id, info.config, "recipe.json")

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=self.STATUS.get(status, "FINISHED"))


class JsonlTracker:
    """``RUN_DIR/metrics.jsonl``: a ``start`` record with the config, one ``log`` record per
    step and per evaluation (the names the other trackers get), an ``end`` record with the status."""

    def open(self, info: RunInfo, first_step: int, resumed: bool) -> None:
        self.fh = (info.run_dir / JSONL_FILE).open("a")
        self._write({"event": "start", "first_step": first_step, "resumed": resumed, **info.config})

    def _write(self, record: dict) -> None:
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()

    def log(self, step: int, values: dict[str, float]) -> None:
        self._write({"event": "log", "step": step, **values})

    def close(self, status: str) -> None:
        self._write({"event": "end", "status": status})
        self.fh.close()


def make_tracker(backend: str, logging):
    """The tracker object of one backend name."""
    if backend == "tensorboard":
        return TensorBoardTracker()
    if backend == "wandb":
        return WandbTracker(logging)
    if backend == "mlflow":
        return MlflowTracker(logging)
    if backend == "jsonl":
        return JsonlTracker()
    raise ValueError(f"unknown tracker backend {backend!r}")


# --------------------------------------------------------------------------- the reporter


class TrackingReporter:
    """The loop's reporter, teed: every call goes to ``inner`` (the terminal, a log
    file) and the metrics to the trackers, which open at the loop's ``start``
    (when the first step is known) and close in :func:`tracking`."""

    def __init__(self, inner, trackers: list, info: RunInfo, resumed: bool):
        self.inner = inner
        self.trackers = trackers
        self.info = info
        self.resumed = resumed
        self.opened: list = []

    def start(self, total_steps, first_step):
        for tracker in self.trackers:
            tracker.open(self.info, first_step, self.resumed)
            self.opened.append(tracker)
        self.inner.start(total_steps, first_step)

    def _send(self, step: int, values: dict[str, float]) -> None:
        for tracker in list(self.opened):
            try:
                tracker.log(step, values)
            except Exception as exc:  # a tracker that breaks mid-run must not stop the training
                self.opened.remove(tracker)
                self.inner.log(f"tracker {type(tracker).__name__} stopped logging: {exc}")

    def step(self, step, metrics):
        self._send(step, scalars(metrics, "train"))
        self.inner.step(step, metrics)

    def eval(self, step, point):
        self._send(step, scalars(point, "eval"))
        self.inner.eval(step, point)

    def log(self, message):
        self.inner.log(message)

    def stop(self):
        self.inner.stop()

    def close(self, status: str) -> None:
        """Close every opened tracker with the run's final status."""
        while self.opened:
            tracker = self.opened.pop(0)
            try:
                tracker.close(status)
            except Exception as exc:
                self.inner.log(f"tracker {type(tracker).__name__} did not close cleanly: {exc}")


@contextmanager
def tracking(recipe, run_dir: Path, inner, *, name: str, key: str, resume: bool = False) -> Iterator:
    """The reporter to hand the loop: ``inner`` alone without ``[logging] backends``,
    else a :class:`TrackingReporter` whose trackers close on exit with the run's
    status (completed; cancelled on KeyboardInterrupt; failed on any other error).

    Args:
        recipe: the run's :class:`scalectl.recipe.schema.Recipe`.
        run_dir: the run folder (TensorBoard, W&B and JSON-lines files go there).
        inner: the reporter the loop would get otherwise (a :class:`scalectl.rl.loop.Reporter`).
        name: the run's name; key: its stable key (:func:`run_key`).
        resume: the run continues from a checkpoint.

    Raises:
        UserError: a backend's library is missing (:func:`check_installed`).
    """
    if not recipe.logging.backends:
        yield inner
        return
    check_installed(recipe.logging)
    if inner is None:
        from scalectl.rl.loop import Reporter

        inner = Reporter()
    info = RunInfo(name, Path(run_dir), recipe.to_dict(), recipe.content_hash, key)
    reporter = TrackingReporter(inner, [make_tracker(b, recipe.logging) for b in recipe.logging.backends],
                                info, resume)
    status = "failed"
    try:
        yield reporter
        status = "completed"
    except KeyboardInterrupt:
        status = "cancelled"
        raise
    finally:
        reporter.close(status)
