"""Simulated training: evaluation points drawn from a given sigmoid, with the noise of real runs.

A recipe whose ``model.path`` is ``simulated:KEY=VALUE,...`` does not train a
model: its job draws the evaluation points of the ScaleRL curve

    R(C) = R0 + (A_s - R0) / (1 + (C_mid / C)^B)

(Khatri et al. 2025, arXiv 2510.13786, eq. 1) at the recipe's evaluation steps,
spends ``seconds_per_step`` of wall time per optimiser step (the chosen speed),
and stores the points through the same store and launcher paths as a real run.
The curve is the "model": it is part of the recipe's content hash, so variants
of a simulated ablation override ``model.path`` (``A=0.55``), and the keys not
given take the defaults of :data:`DEFAULTS`.

Noise (three parts, each drawn from a generator seeded by the run's seed and
the curve, so a run extended to a larger budget keeps its earlier points):

* a **seed offset** of the ceiling, ``A_s = A + N(0, seed_sd)``: repeated runs
  of one recipe end at different ceilings (the paper saw three seeds within
  +-0.015, its reason for the 0.02 margin; section 3);
* a **correlated** component: an AR(1) sequence over the evaluation points,
  stationary sd ``corr_sd``, lag-one correlation ``corr_rho`` (a run that is
  ahead stays ahead for a while);
* an **independent** evaluation noise, sd ``eval_sd`` (binomial sampling of
  ``prompts x samples`` completions).

The default sizes come from real runs of the tiny setup (``setups/tiny-cpu.toml``,
see ``docs/ablations.md``, "The simulated backend").

Compute: ``hours_per_step`` device-hours per optimiser step; points carry
``step``, ``gpu_hours`` and ``samples``.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from scalectl.errors import UserError

PREFIX = "simulated:"


@dataclass(frozen=True)
class SimCurve:
    """A simulated recipe: its true curve, noise sizes and speed.

    A, R0: pass rates in [0, 1]; B > 0; C_mid > 0 in device-hours;
    hours_per_step: device-hours per optimiser step (> 0); seconds_per_step:
    wall seconds slept per step (>= 0); eval_sd, corr_sd, seed_sd >= 0 (pass
    rate units); corr_rho in [0, 1).
    """

    A: float = 0.60
    B: float = 2.0
    C_mid: float = 0.1
    R0: float = 0.30
    hours_per_step: float = 0.001
    seconds_per_step: float = 0.0
    eval_sd: float = 0.006
    corr_sd: float = 0.006
    corr_rho: float = 0.6
    seed_sd: float = 0.005

    def spec(self) -> str:
        """The ``model.path`` string of this curve (every key written out)."""
        return PREFIX + ",".join(f"{f.name}={getattr(self, f.name):g}" for f in fields(self))

    def true_pass_rate(self, gpu_hours: Any):
        """The noise-free curve at ``gpu_hours`` (array-like, >= 0)."""
        from scalectl.curve import sigmoid

        return sigmoid(gpu_hours, self.A, self.B, self.C_mid, self.R0)


DEFAULTS = SimCurve()
_FLOAT_KEYS = {f.name for f in fields(SimCurve)}


def is_simulated(model_path: str) -> bool:
    """Whether a recipe's ``model.path`` names a simulated curve."""
    return str(model_path).startswith(PREFIX)


def parse_spec(model_path: str, where: str = "model.path") -> SimCurve:
    """``simulated:A=0.55,B=1.8`` -> :class:`SimCurve` (keys not given: :data:`DEFAULTS`).

    Raises:
        UserError: a missing prefix, an unknown key (naming the allowed ones),
            a value that is not a number, or a value out of range.
    """
    if not is_simulated(model_path):
        raise UserError(f"{where} = {model_path!r} does not start with {PREFIX!r}")
    body = model_path[len(PREFIX):].strip()
    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in _FLOAT_KEYS:
            raise UserError(f"{where}: {part!r} is not KEY=NUMBER with KEY one of: "
                            f"{', '.join(sorted(_FLOAT_KEYS))}")
        try:
            values[key] = float(raw)
        except ValueError:
            raise UserError(f"{where}: {key} = {raw!r} is not a number") from None
    curve = replace(DEFAULTS, **values)
    checks = [
        ("A", 0 <= curve.A <= 1, "in [0, 1]"), ("R0", 0 <= curve.R0 <= 1, "in [0, 1]"),
        ("B", curve.B > 0, "> 0"), ("C_mid", curve.C_mid > 0, "> 0"),
        ("hours_per_step", curve.hours_per_step > 0, "> 0"),
        ("seconds_per_step", curve.seconds_per_step >= 0, ">= 0"),
        ("eval_sd", curve.eval_sd >= 0, ">= 0"), ("corr_sd", curve.corr_sd >= 0, ">= 0"),
        ("seed_sd", curve.seed_sd >= 0, ">= 0"), ("corr_rho", 0 <= curve.corr_rho < 1, "in [0, 1)"),
    ]
    for key, ok, allowed in checks:
        if not ok:
            raise UserError(f"{where}: {key} = {getattr(curve, key):g} must be {allowed}")
    return curve


def _rng(curve: SimCurve, seed: int, stream: int):
    """The generator of one noise component (0: seed offset, 1: evaluation, 2: correlated)."""
    import numpy as np

    digest = hashlib.sha256(f"{curve.spec()}|{seed}".encode()).digest()
    return np.random.default_rng([int.from_bytes(digest[:8], "little"), stream])


def draw_points(curve: SimCurve, seed: int, steps) -> list[dict]:
    """Evaluation points of one simulated run at optimiser ``steps`` (ascending, >= 0).

    Returns one dict per step with ``step``, ``gpu_hours`` (device-hours),
    ``samples`` and ``pass_rate`` (clipped to [0, 1]).  The noise of the k-th
    evaluation depends only on (curve, seed, k), so the points of a run
    extended to more steps begin with those of the shorter run.
    """
    import numpy as np

    steps = [int(s) for s in steps]
    if not steps:
        return []
    n_max = len(steps)
    a_seed = curve.A + curve.seed_sd * _rng(curve, seed, 0).standard_normal()
    # one stream per component: the first k draws do not depend on how many follow
    eps_eval = _rng(curve, seed, 1).standard_normal(n_max)
    innov = _rng(curve, seed, 2).standard_normal(n_max)
    ar = np.empty(n_max)
    scale = curve.corr_sd * math.sqrt(1 - curve.corr_rho ** 2)
    ar[0] = curve.corr_sd * innov[0]
    for k in range(1, n_max):
        ar[k] = curve.corr_rho * ar[k - 1] + scale * innov[k]
    hours = np.array(steps, dtype=float) * curve.hours_per_step
    from scalectl.curve import sigmoid

    mean = sigmoid(hours, min(max(a_seed, 0.0), 1.0), curve.B, curve.C_mid, curve.R0)
    # before training the model is the warm start: no training drift at step 0
    drift = np.where(hours > 0, ar, 0.0)
    y = np.clip(mean + drift + curve.eval_sd * eps_eval, 0.0, 1.0)
    return [{"step": s, "gpu_hours": float(h), "samples": 0, "pass_rate": float(p)}
            for s, h, p in zip(steps, hours, y)]


def eval_steps(budget_steps: int, every: int) -> list[int]:
    """Steps evaluated by a run trained to ``budget_steps``: 0, every, 2 every, ..., and the last."""
    out = list(range(0, budget_steps + 1, every))
    if out[-1] != budget_steps:
        out.append(budget_steps)
    return out


def simulated_points(recipe, seed: int | None = None) -> list[dict]:
    """The points a simulated recipe yields over its whole budget (pure; no sleeping)."""
    curve = parse_spec(recipe.model.path)
    if recipe.budget.steps is None:
        raise UserError("a simulated run needs budget.steps")
    return draw_points(curve, recipe.seed if seed is None else seed,
                       eval_steps(recipe.budget.steps, recipe.eval.every_steps))


def run_simulated(recipe, store, run_id: int) -> dict:
    """The job body of a simulated run: store its points, step by step, at the chosen speed.

    Continues after the last stored step (a resumed or extended run keeps its
    points: they depend only on the curve and the seed).  Sleeps
    ``seconds_per_step`` per optimiser step between points, so a Ctrl-C
    (KeyboardInterrupt) lands between two points and leaves the stored ones intact.
    Returns a summary like the real loop's.
    """
    curve = parse_spec(recipe.model.path)
    points = simulated_points(recipe)
    done = {p["step"] for p in store.points(run_id)}
    last_step = 0
    for p in points:
        if p["step"] in done:
            last_step = p["step"]
            continue
        time.sleep(curve.seconds_per_step * (p["step"] - last_step))
        store.add_point(run_id, p)
        last_step = p["step"]
    return {"steps": recipe.budget.steps, "first_pass_rate": points[0]["pass_rate"],
            "last_pass_rate": points[-1]["pass_rate"], "flops": None,
            "gpu_hours": points[-1]["gpu_hours"], "retired_prompts": 0, "simulated": asdict(curve)}
