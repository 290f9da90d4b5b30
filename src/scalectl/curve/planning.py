"""Planning helpers on fitted curves: the spread of repeated seeds, what a step of a run
costs (:class:`StepRate`), the one rule of enough data (:data:`IDENTIFY_REACH`,
:func:`identifies`, :func:`identifying_steps`), and what would narrow the interval of the
ceiling (extend the run, or add seeds), in steps, device-hours and wall-clock."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from scalectl.curve.model import SigmoidFit
from scalectl.defaults import IDENTIFY_REACH, MARGIN
from scalectl.display import AXIS_UNITS, duration_text, format_number

#: The rule in words, for sentences.
RULE_TEXT = f"{IDENTIFY_REACH:g} x C_mid, where a ceiling counts as identified (docs/fitting.md)"


def identifies(fit: SigmoidFit, reach: float = IDENTIFY_REACH) -> bool:
    """Whether ``fit`` identifies its ceiling by the one rule of enough data: no
    ``ceiling_not_identified`` flag, A on no bound, and its points reach ``reach`` x C_mid
    (:data:`scalectl.defaults.IDENTIFY_REACH`, measured in docs/fitting.md, "How far a run must go")."""
    return not fit.ceiling_problems(reach=reach)


def identifying_steps(C_mid: float, compute_per_step: float, step_multiple: int = 1,
                      reach: float = IDENTIFY_REACH) -> int:
    """Optimiser steps whose compute reaches ``reach`` x ``C_mid`` (the rule of enough data),
    rounded up to a multiple of ``step_multiple`` (the evaluation interval, so that the last step
    is evaluated): ``reach C_mid / compute_per_step``.  ``C_mid`` and ``compute_per_step`` on one
    compute axis (e.g. device-hours and device-hours per step).

    Raises:
        ValueError: ``C_mid`` or ``compute_per_step`` not > 0, or ``step_multiple`` < 1.
    """
    if not (C_mid > 0 and compute_per_step > 0) or step_multiple < 1:
        raise ValueError(f"need C_mid > 0, compute_per_step > 0 and step_multiple >= 1 "
                         f"(given {C_mid}, {compute_per_step}, {step_multiple})")
    steps = reach * C_mid / compute_per_step
    return max(step_multiple, int(math.ceil(steps / step_multiple - 1e-9)) * step_multiple)


@dataclass(frozen=True)
class Spread:
    """Spread of one parameter over repeated runs (seeds) of the same recipe."""

    name: str
    n: int
    mean: float
    sd: float
    min: float
    max: float

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """Student-t interval of the mean over seeds (needs n >= 2)."""
        from scipy.stats import t

        if self.n < 2:
            raise ValueError(f"a seed interval of {self.name} needs at least 2 runs, got {self.n}")
        h = t.ppf(0.5 + level / 2, self.n - 1) * self.sd / math.sqrt(self.n)
        return self.mean - h, self.mean + h


def seed_spread(fits: Sequence[SigmoidFit]) -> dict[str, Spread]:
    """Mean, sample sd, min and max of A, B and C_mid over fits of repeated runs.

    The paper (section 3/A.4) saw ceilings of three seeds within +-0.015, the basis
    of its 0.02 margin.  Raises ValueError on an empty list.
    """
    if not fits:
        raise ValueError("seed_spread needs at least one fit")
    out = {}
    for name in ("A", "B", "C_mid"):
        v = np.array([getattr(f, name) for f in fits], dtype=float)
        out[name] = Spread(name, v.size, float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0,
                           float(v.min()), float(v.max()))
    return out


@dataclass(frozen=True)
class StepRate:
    """What one optimiser step of a run costs, measured on its evaluation points.

    Attributes:
        axis: the compute axis (``gpu_hours``, ``flops``, ``tokens``, ``step``).
        compute_per_step: compute on ``axis`` per step (> 0).
        last_step, last_compute: where the run's points end.
        hours_per_step: device-hours (GPU-hours on GPUs) per step, None when not measured.
        seconds_per_step: wall-clock seconds of generation and training per step (what
            GPU-hours count; evaluations add to it), None when not measured.
        source: where the rate was measured (for sentences).
    """

    axis: str
    compute_per_step: float
    last_step: int
    last_compute: float
    hours_per_step: float | None = None
    seconds_per_step: float | None = None
    source: str = "this run"

    def steps_to(self, compute: float) -> int:
        """Steps more, past the last point, until the run's compute reaches ``compute`` (>= 0)."""
        return max(0, math.ceil((compute - self.last_compute) / self.compute_per_step - 1e-9))

    def cost_text(self, steps: int) -> str:
        """``0.17 device-hours, about 25 min`` for ``steps`` steps at this rate ('' when
        neither was measured)."""
        parts = []
        if self.hours_per_step is not None:
            parts.append(f"{format_number(steps * self.hours_per_step, 3)} device-hours")
        if self.seconds_per_step is not None:
            parts.append(f"about {duration_text(steps * self.seconds_per_step)}")
        return ", ".join(parts)


def step_rate(points: Sequence[Mapping[str, Any]], axis: str, source: str = "this run") -> StepRate | None:
    """The :class:`StepRate` of a run from its evaluation points (dicts with ``step``, the
    ``axis`` key, and where present ``gpu_hours`` and ``wall_seconds``): the change of each
    between the first and the last point over the steps between them.  None when fewer than
    two points at different steps carry the axis, or the compute did not grow.
    """
    pts = [p for p in points if p.get("step") is not None and (axis == "step" or p.get(axis) is not None)]
    if len(pts) < 2 or pts[-1]["step"] <= pts[0]["step"]:
        return None
    first, last = pts[0], pts[-1]
    steps = last["step"] - first["step"]

    def per_step(key: str) -> float | None:
        a, b = first.get(key), last.get(key)
        return (float(b) - float(a)) / steps if a is not None and b is not None and b > a else None

    value = (lambda p: float(p["step"])) if axis == "step" else (lambda p: float(p[axis]))
    cps = (value(last) - value(first)) / steps
    if not cps > 0:
        return None
    return StepRate(axis, cps, int(last["step"]), value(last), per_step("gpu_hours"), per_step("wall_seconds"),
                    source)


@dataclass(frozen=True)
class Advice:
    """What would narrow the interval of A, or pin it: ``action`` is none, extend or seeds.

    With a :class:`StepRate`, ``steps`` is how many more steps the extension needs (or
    the steps of each seed's run), and ``device_hours`` / ``seconds`` what they cost
    (None where not measured)."""

    action: Literal["none", "extend", "seeds"]
    width: float
    margin: float
    message: str
    seeds_needed: int | None = None
    steps: int | None = None
    device_hours: float | None = None
    seconds: float | None = None


def _compute_text(value: float, axis: str) -> str:
    return f"{format_number(value, 4)} {AXIS_UNITS.get(axis, axis)}"


def _width_and_margin(width: float, margin: float) -> tuple[str, str]:
    """The A interval width and the margin as text, with a fourth decimal when three would
    print a width just past the margin (0.0204 against 0.02) as the same number."""
    digits = 3 if f"{width:.3f}" != f"{margin:.3f}" or width == margin else 4
    return f"{width:.{digits}f}", f"{margin:.{digits}f}"


def advise(fit: SigmoidFit, margin: float = MARGIN, n_seeds: int = 1, rate: StepRate | None = None) -> Advice:
    """Say whether the data identify the ceiling and the A interval is within ``margin``, and
    what would help more.

    Data short of :data:`~scalectl.defaults.IDENTIFY_REACH` x C_mid (the one rule of enough
    data; docs/fitting.md, "How far a run must go"), or a ceiling/bound flag, leave A traded
    off against C_mid and B, however narrow its interval: extending the run to that reach
    helps (to twice the reach when A sits on a bound although the data reach it), more seeds
    do not.  Otherwise the width is noise: averaging s seeds shrinks it about as 1/sqrt(s),
    so about n_seeds * (width / margin)^2 seeds are needed.  With the run's ``rate``
    (:func:`step_rate`) the advice also says how many more steps the extension takes, or how
    long each seed's run is, and what that costs in device-hours and wall-clock.

    Raises:
        ValueError: the fit has no interval for A.
    """
    iv = fit.interval("A")
    if iv is None:
        raise ValueError("this fit has no interval for A: fit with bootstrap > 0")
    width = iv[1] - iv[0]
    reach = fit.window[1] / fit.C_mid
    w_text, m_text = _width_and_margin(width, margin)
    if not identifies(fit) or fit.has_flag("on_bound"):
        if reach < IDENTIFY_REACH:
            why, target = f"the data stop at {reach:.2f} x C_mid, short of {RULE_TEXT}", IDENTIFY_REACH
        else:   # far enough past C_mid, but an estimate sits on its bound: twice as long
            on = sorted({f.param for f in fit.flags if f.code == "on_bound" and f.param})
            why = (f"{' and '.join(on) or 'a parameter'} lie{'s' if len(on) < 2 else ''} on a bound "
                   f"although the data reach {reach:.2f} x C_mid")
            target = 2.0 * reach
        more, steps = "", None
        if rate is not None and rate.axis == fit.axis:
            steps = rate.steps_to(target * fit.C_mid)
            cost = rate.cost_text(steps)
            more = (f": about {steps:,} more steps (to step {rate.last_step + steps:,}"
                    + (f"; {cost} at {rate.source}'s measured rate" if cost else "") + ")")
        size = f"exceeds the margin {m_text} and" if width > margin else f"is within the margin {m_text}, but"
        return Advice("extend", width, margin,
                      f"A interval width {w_text} {size} {why}: extend "
                      f"the run to about {target:.3g} x C_mid ({_compute_text(target * fit.C_mid, fit.axis)})"
                      f"{more}; more seeds would not pin the ceiling", steps=steps,
                      **_cost(rate, steps))
    if width <= margin:
        return Advice("none", width, margin, f"A interval width {w_text} is within the "
                                             f"margin {m_text}")
    need = max(n_seeds + 1, math.ceil(n_seeds * (width / margin) ** 2))
    more, steps = "", None
    if rate is not None:
        steps = rate.last_step
        cost = rate.cost_text(steps * (need - n_seeds))
        more = (f": {need - n_seeds} more run(s) of {steps:,} steps"
                + (f", {cost} in all at {rate.source}'s measured rate" if cost else ""))
    return Advice("seeds", width, margin,
                  f"A interval width {w_text} exceeds the margin {m_text} although the data "
                  f"reach {reach:.2f} x C_mid: the width is noise; about {need} seeds (or more "
                  f"evaluation prompts) would bring it within the margin{more}", seeds_needed=need, steps=steps,
                  **_cost(rate, None if steps is None else steps * (need - n_seeds)))


def _cost(rate: StepRate | None, steps: int | None) -> dict:
    if rate is None or steps is None:
        return {}
    return {"device_hours": None if rate.hours_per_step is None else steps * rate.hours_per_step,
            "seconds": None if rate.seconds_per_step is None else steps * rate.seconds_per_step}
