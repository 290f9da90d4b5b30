"""What a run's budget books: the rate per step, the steps the budget buys, the wall-clock
and the checkpoint disk, for the dry run (``scalectl run --dry-run``).

* **The rate.** Measured when the store holds runs of the same recipe shape on the same
  hardware (:func:`rate_key`: hardware class and device counts, model, batch, generation
  budget, async mode): the median over them of GPU-hours per step and of wall-clock
  seconds per step between stored points (:func:`measured_rate`).  Otherwise estimated
  (:func:`estimated_rate`) from tokens and the model size, the compute accounting's own
  formula (:mod:`scalectl.rl.accounting`; Kaplan et al. 2020, arXiv 2001.08361, section
  2.1): FLOPs per step = 2N x generated-or-prefilled tokens + 6N x trained tokens, every
  completion counted at its limits (``length.max_prompt_tokens`` +
  ``length.max_new_tokens``, an upper bound), at :data:`ESTIMATE_UTILISATION` of the
  devices' peak (:data:`PEAK_FLOPS`, by ``hardware.name``).  Evaluations are priced the
  same way: 2N x (prompts x samples) x the same tokens each.
* **The budget.** ``budget.steps``, or ``budget.gpu_hours`` / GPU-hours per step (GPU-hours
  count generation and training only), the smaller when both are set.
* **The wall-clock.** steps x seconds per step, plus the evaluations (one every
  ``eval.every_steps`` and one at the end) when the rate does not already hold them.
* **What to book** (:func:`reserve`, the dry run's bottom line): the devices held for the
  whole wall-clock, evaluations included, plus what each requeue of a Slurm job trains again
  (up to ``checkpoint.every_steps`` steps since the last checkpoint, the worst case, which the
  number of jobs also assumes): GPU-hours = devices x (steps + evaluations + requeues x redo).
  The GPU-hours a budget buys count generation and training only (the run's compute axis), so
  the booking is larger than ``budget.gpu_hours``.
* **The disk.** A checkpoint holds the weights and the AdamW states (not the gradients):
  parameters x (w + K) bytes (:data:`scalectl.job.layout.ADAM_BYTES`: bf16 2 + 12, fp32
  4 + 8); ``checkpoint.keep`` are kept and one more is written before the oldest goes
  (:mod:`scalectl.rl.checkpoint`).

Pure functions on a :class:`scalectl.recipe.schema.Recipe`, plain numbers and stored rows.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from scalectl.display import bytes_text, count_text, duration_text, format_number
from scalectl.job.layout import ADAM_BYTES

#: Peak dense bf16 tensor throughput of one device (FLOP/s, without sparsity), by the start
#: of ``hardware.name``, from the vendors' data sheets (NVIDIA H100/H200 SXM, A100 SXM,
#: B200, GB200 per GPU, L40S; AMD MI300X).  A class not listed gets no estimate.
PEAK_FLOPS = {"GB200": 2.5e15, "B200": 2.25e15, "H200": 9.89e14, "H100": 9.89e14, "A100": 3.12e14,
              "L40S": 3.62e14, "MI300X": 1.307e15}
#: The share of that peak the estimate assumes for a whole RL step.  Long generations are
#: decoded token by token, memory-bound, far below peak, while training runs near 40 %;
#: 5 % of peak over all devices is a deliberately low assumption for booking.  A stored
#: run of the recipe on the hardware replaces the estimate by a measured rate.
ESTIMATE_UTILISATION = 0.05


@dataclass(frozen=True)
class StepRate:
    """The stated rate of a run's steps.

    Attributes:
        seconds_per_step: wall-clock seconds per optimiser step.
        gpu_hours_per_step: GPU-hours (devices x hours of generation and training) per step.
        eval_seconds: wall-clock seconds of one evaluation, None when ``seconds_per_step``
            already holds the evaluations (measured between stored points).
        source: how the rate was obtained, for people.
        measured: True when measured on stored runs, False for the estimate.
    """

    seconds_per_step: float
    gpu_hours_per_step: float
    eval_seconds: float | None
    source: str
    measured: bool


def rate_key(recipe: Any) -> tuple:
    """What a step's duration depends on: hardware class and device counts, model, batch,
    generation budget and async mode (``recipe`` a Recipe or its ``to_dict()``)."""
    d = recipe if isinstance(recipe, dict) else recipe.to_dict()
    hw, b = d["hardware"], d["batch"]
    return (hw["name"], hw["generators"], hw["trainers"], d["model"]["path"], b["prompts_per_step"],
            b["generations_per_prompt"], d["length"]["max_new_tokens"], d["async"]["mode"])


def _between(points: Sequence[dict], key: str) -> float | None:
    """Median over consecutive points of the change of ``key`` per step (> 0 changes only)."""
    rates = []
    for a, b in zip(points, points[1:]):
        if a.get(key) is None or b.get(key) is None or b["step"] <= a["step"]:
            continue
        da = _seconds(b[key]) - _seconds(a[key]) if key == "time" else float(b[key]) - float(a[key])
        if da > 0:
            rates.append(da / (b["step"] - a["step"]))
    return statistics.median(rates) if rates else None


def _seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()


def measured_rate(recipe, stored: Sequence[tuple[dict, list[dict]]], where: str) -> StepRate | None:
    """The rate measured on ``stored`` runs ((run row, its points) of the store at ``where``)
    of the same :func:`rate_key` as ``recipe``: medians over the runs of GPU-hours per step and
    of wall-clock seconds per step between points stored one after another (evaluations and
    checkpoints included; points taken in together from a journal carry no time between
    them and are skipped).  None when no run of that key has two points with both."""
    key = rate_key(recipe)
    hours, secs, names = [], [], []
    for run, points in stored:
        rec = run.get("recipe") or {}
        if not rec or rate_key(rec) != key:
            continue
        h, s = _between(points, "gpu_hours"), _between(points, "time")
        if h is not None and s is not None:
            hours.append(h)
            secs.append(s)
            names.append(run["name"])
    if not names:
        return None
    return StepRate(statistics.median(secs), statistics.median(hours), None,
                    f"measured on {len(names)} stored run(s) of this recipe on {recipe.hardware.name} in {where} "
                    f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): GPU-hours and wall-clock "
                    "between their evaluation points, evaluations and checkpoints included", True)


def step_flops(recipe, params: int) -> tuple[float, float]:
    """(FLOPs of one optimiser step, FLOPs of one evaluation), every completion at its token
    limits: 2N (prompt + completion) generated-or-prefilled and 6N (prompt + completion) trained
    per completion of the step; 2N of the same per evaluation completion."""
    tokens = recipe.length.max_prompt_tokens + recipe.length.max_new_tokens
    completions = recipe.batch.prompts_per_step * recipe.batch.generations_per_prompt
    evaluated = recipe.eval.prompts * recipe.eval.samples_per_prompt
    return 8.0 * params * completions * tokens, 2.0 * params * evaluated * tokens


def peak_flops(hardware_name: str) -> float | None:
    """:data:`PEAK_FLOPS` of the class ``hardware_name`` starts with (case ignored), else None."""
    name = hardware_name.upper()
    return next((v for k, v in PEAK_FLOPS.items() if name.startswith(k)), None)


def estimated_rate(recipe, params: int | None) -> StepRate | None:
    """The estimate of the module docstring, or None without a parameter count or a known peak."""
    peak = peak_flops(recipe.hardware.name)
    if params is None or peak is None:
        return None
    devices = recipe.hardware.devices
    per_step, per_eval = step_flops(recipe, params)
    speed = devices * peak * ESTIMATE_UTILISATION
    seconds = per_step / speed
    tokens = recipe.length.max_prompt_tokens + recipe.length.max_new_tokens
    completions = recipe.batch.prompts_per_step * recipe.batch.generations_per_prompt
    return StepRate(seconds, devices * seconds / 3600.0, per_eval / speed,
                    f"an estimate: FLOPs per step = 2N x generated + 6N x trained tokens = 8 x {count_text(params)} "
                    f"x {completions:,} completions x {tokens:,} tokens (at most {recipe.length.max_prompt_tokens:,} "
                    f"prompt + {recipe.length.max_new_tokens:,} generated) = {format_number(per_step)}, at "
                    f"{ESTIMATE_UTILISATION:.0%} of {devices} x {recipe.hardware.name} peak "
                    f"{peak / 1e12:,.0f} TFLOP/s (bf16 dense); a stored run of this recipe on this hardware "
                    "gives a measured rate", False)


@dataclass(frozen=True)
class Reservation:
    """What to book for a run: its devices for its whole wall-clock, in ``jobs`` jobs.

    Hours are rounded to 0.1 h before they are added, so that the printed parts add up to the
    printed total and GPU-hours = devices x wall-clock holds for the printed numbers.

    Attributes:
        devices: devices held (GPUs of the allocation; CPUs of a CPU run).
        jobs: jobs the wall-clock takes (1 without a time limit); requeues = jobs - 1.
        job_hours: the time limit of one job in hours (None: no limit).
        step_hours: wall-clock hours of the optimiser steps.
        eval_hours: wall-clock hours of the evaluations (0 when the rate holds them: measured).
        redo_hours: hours one requeue trains again at most (``checkpoint.every_steps`` steps).
        wall_hours: step_hours + eval_hours + (jobs - 1) x redo_hours.
        device_hours: devices x wall_hours: what to book.
        measured: the rate was measured on stored runs (False: estimated).
        estimate: how the rate was estimated, for people ('' when measured).
    """

    devices: int
    jobs: int
    job_hours: float | None
    step_hours: float
    eval_hours: float
    redo_hours: float
    wall_hours: float
    device_hours: float
    measured: bool
    estimate: str

    @property
    def requeues(self) -> int:
        return self.jobs - 1


@dataclass(frozen=True)
class Booking:
    """What the budget books at a rate.

    Attributes:
        steps: optimiser steps the budget buys (None: neither a step nor a GPU-hour budget).
        gpu_hours: GPU-hours of generation and training of those steps.
        evaluations: evaluations of the run (step 0 is counted when the run starts there).
        wall_seconds: wall-clock of the run, evaluations included.
        redo_seconds: wall-clock of the steps a requeue trains again (``checkpoint.every_steps``).
        checkpoint_bytes: one checkpoint; disk_bytes: the most on disk at once.
        rate: the :class:`StepRate`.
        reservation: what to book (:func:`reserve`), set once the launcher's jobs are known.
    """

    steps: int | None
    gpu_hours: float | None
    evaluations: int
    wall_seconds: float | None
    redo_seconds: float
    checkpoint_bytes: float | None
    disk_bytes: float | None
    rate: StepRate | None
    reservation: Reservation | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def checkpoint_bytes(params: int, dtype: str) -> float:
    """Bytes of one checkpoint: parameters x (weight + AdamW state bytes), gradients not saved."""
    w, _, k = ADAM_BYTES[dtype]
    return float(params) * (w + k)


def book(recipe, params: int | None, rate: StepRate | None) -> Booking:
    """The steps, GPU-hours, wall-clock and disk of ``recipe``'s budget at ``rate`` (module docstring)."""
    b = recipe.budget
    steps = b.steps
    if b.gpu_hours is not None and rate is not None:
        bought = int(b.gpu_hours / rate.gpu_hours_per_step)
        steps = bought if steps is None else min(steps, bought)
    evals = 0 if steps is None else len({s for s in range(recipe.eval.every_steps, steps + 1, recipe.eval.every_steps)}
                                         | {steps}) + 1
    wall = None
    if steps is not None and rate is not None:
        wall = steps * rate.seconds_per_step + evals * (rate.eval_seconds or 0.0)
    redo = 0.0 if rate is None else min(recipe.checkpoint.every_steps, steps or 0) * rate.seconds_per_step
    one = None if params is None else checkpoint_bytes(params, recipe.model.dtype)
    return Booking(steps, None if steps is None or rate is None else steps * rate.gpu_hours_per_step, evals,
                   wall, redo, one, None if one is None else one * (recipe.checkpoint.keep + 1), rate)


def booking_lines(recipe, params: int | None, booking: Booking) -> list[str]:
    """The dry run's lines about the budget: the rate and where it comes from, the steps, the
    wall-clock, the checkpoint disk (the bottom line, what to book, is :func:`reservation_line`)."""
    r, lines = booking.rate, []
    if r is None:
        why = ("no parameter count" if params is None else
               f"no peak throughput known for hardware.name = {recipe.hardware.name!r}")
        lines.append(f"rate: not known ({why}, and no stored run of this recipe on this hardware): wall-clock "
                     "and the steps a GPU-hour budget buys are not estimated")
    else:
        lines.append(f"rate: {r.seconds_per_step:.3g} s and {r.gpu_hours_per_step:.3g} GPU-hours per step, "
                     f"{r.source}")
    if booking.steps is not None:
        spent = (f", {booking.gpu_hours:,.0f} GPU-hours of generation and training (the run's compute axis; "
                 "evaluations and requeues come on top: 'to book' below)" if booking.gpu_hours is not None else "")
        b = recipe.budget
        given = (f"{booking.steps:,} steps (budget.steps)" if b.gpu_hours is None or booking.steps == b.steps
                 else f"budget.gpu_hours = {b.gpu_hours:g} buys {booking.steps:,} steps")
        lines.append(f"budget: {given}{spent}, {booking.evaluations} evaluations")
    if booking.wall_seconds is not None:
        evals = ("" if r.eval_seconds is None else
                 f" = {duration_text(booking.steps * r.seconds_per_step)} of steps + {booking.evaluations} "
                 f"evaluations x {duration_text(r.eval_seconds)}")
        lines.append(f"wall-clock: about {duration_text(booking.wall_seconds)}{evals}")
    if booking.checkpoint_bytes is not None:
        w, _, k = ADAM_BYTES[recipe.model.dtype]
        lines.append(f"checkpoint disk: {bytes_text(booking.checkpoint_bytes)} per checkpoint ({count_text(params)} "
                     f"parameters x ({w} bytes of weights + {k} of AdamW states)); checkpoint.keep = "
                     f"{recipe.checkpoint.keep} kept + 1 while the next is saved: {bytes_text(booking.disk_bytes)} "
                     "in the run folder")
    return lines


def _tenths(seconds: float) -> float:
    return round(seconds / 3600.0, 1)


def reserve(booking: Booking, devices: int, jobs: int = 1, job_seconds: float | None = None
            ) -> Reservation | None:
    """What to book for ``booking`` (module docstring): ``devices`` held for the wall-clock of its
    steps and evaluations and, for each of the ``jobs - 1`` requeues, ``booking.redo_seconds``
    trained again.  None when the wall-clock is not known (no rate, or no step budget).

    Args:
        booking: the run's :class:`Booking`.
        devices: devices the run holds (a Slurm job: its nodes x GPUs per node).
        jobs: jobs the run takes (:func:`scalectl.launch.slurm.time_limit_jobs`), >= 1.
        job_seconds: the time limit of one job (None: none).

    Raises:
        ValueError: ``jobs`` < 1 or ``devices`` < 1.
    """
    if jobs < 1 or devices < 1:
        raise ValueError(f"jobs = {jobs} and devices = {devices} must be >= 1")
    r = booking.rate
    if booking.wall_seconds is None or r is None or booking.steps is None:
        return None
    step_h = _tenths(booking.steps * r.seconds_per_step)
    eval_h = _tenths(booking.evaluations * (r.eval_seconds or 0.0))
    redo_h = _tenths(booking.redo_seconds) if jobs > 1 else 0.0
    wall = round(step_h + eval_h + (jobs - 1) * redo_h, 1)
    estimate = "" if r.measured else f"{ESTIMATE_UTILISATION:.0%} of the devices' peak FLOP/s"
    return Reservation(devices, jobs, None if job_seconds is None else job_seconds / 3600.0, step_h, eval_h,
                       redo_h, wall, round(devices * wall, 1), r.measured, estimate)


def _hours(h: float) -> str:
    return f"{h:,.1f} h"


def reservation_line(recipe, res: Reservation) -> str:
    """The dry run's bottom line: the device-hours to book, the wall-clock and the jobs, each
    part of the sum named, and whether the rate behind them is measured or estimated."""
    unit = "CPU" if recipe.hardware.device == "cpu" else "GPU"
    parts = [f"{_hours(res.step_hours)} of steps"]
    if res.eval_hours:
        parts.append(f"{_hours(res.eval_hours)} of evaluations")
    if res.requeues:
        parts.append(f"{_hours(res.requeues * res.redo_hours)} trained again after {res.requeues} "
                     f"requeue(s), up to {_hours(res.redo_hours)} each")
    jobs = (f"{res.jobs} job(s) of at most {_hours(res.job_hours)}" if res.job_hours is not None
            else f"{res.jobs} job")
    rate = ("at the rate measured on stored runs (evaluations and checkpoints in its wall-clock)" if res.measured
            else f"at an estimated rate, not a measured one ({res.estimate}, a deliberately low assumption; "
                 "a stored run of this recipe on this hardware replaces it)")
    hours = f"{res.device_hours:,.0f}" if res.device_hours >= 100 else f"{res.device_hours:.1f}"
    return (f"to book: {hours} {unit}-hours = {res.devices} {unit}s x {_hours(res.wall_hours)} "
            f"wall-clock ({' + '.join(parts)}), {jobs}; {rate}")

