"""Extrapolation checks: fit a prefix of a run, score the prediction on the rest.

Method.md section 4 (Khatri et al. 2025, section 4 and appendix A.7): the paper
fits ScaleRL 8B up to 50k GPU-hours and checks the run to 100k against the
curve, and reports how A and B move with the fit window (1.5k-50k: A 0.645,
B 1.70; 0-100k: 0.655, 1.56; 5k-50k: 0.645, 1.67).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from scalectl.curve import FitError, SigmoidFit, fit_sigmoid

#: Sd of the drift of a run away from its own curve beyond the fitted points, added
#: to the prediction band.  Half the paper's 0.02 margin: three seeds of one recipe
#: landed within +-0.015 (Khatri et al. 2025, section 3), a between-run sd of ~0.01.
DRIFT_SD = 0.01


@dataclass(frozen=True)
class Extrapolation:
    """A prefix fit and its prediction on the held-out points.

    ``cut``: last compute used by the fit.  held-out arrays are (m,), the points
    with compute > cut.  ``band_lo``/``band_hi``: the fit's bootstrap prediction
    band at the held-out compute (empty when fitted without bootstrap, and
    ``share_in_band`` is then None).  Errors are absolute pass-rate differences.
    """

    cut: float
    fit: SigmoidFit
    heldout_compute: np.ndarray
    heldout_pass_rate: np.ndarray
    predicted: np.ndarray
    band_lo: np.ndarray
    band_hi: np.ndarray
    mean_abs_error: float
    max_abs_error: float
    share_in_band: float | None
    drift_sd: float = DRIFT_SD

    def to_dict(self) -> dict[str, Any]:
        return {
            "cut": self.cut, "fit": self.fit.to_dict(),
            "heldout": [{"compute": float(c), "pass_rate": float(r), "predicted": float(p)}
                        for c, r, p in zip(self.heldout_compute, self.heldout_pass_rate,
                                           self.predicted)],
            "mean_abs_error": self.mean_abs_error, "max_abs_error": self.max_abs_error,
            "share_in_band": self.share_in_band,
        }


def cut_point(compute: Sequence[float], until: float | None = None,
              fraction: float | None = None) -> float:
    """The compute at which the fit stops: ``until`` itself, or ``fraction`` of the largest compute.

    Raises ValueError unless exactly one is given and fraction lies in (0, 1).
    """
    if (until is None) == (fraction is None):
        raise ValueError("give exactly one of until (a compute value) or fraction (of the run)")
    if fraction is not None:
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"fraction must lie strictly between 0 and 1 (given {fraction})")
        return float(fraction * np.max(compute))
    return float(until)


def extrapolate(compute: Sequence[float] | np.ndarray, pass_rate: Sequence[float] | np.ndarray, *,
                until: float | None = None, fraction: float | None = None,
                drift_sd: float = DRIFT_SD, **fit_kwargs: Any) -> Extrapolation:
    """Fit the points with compute <= cut and predict the points beyond it.

    compute, pass_rate (n,); ``until`` (compute units) or ``fraction`` of the
    largest compute sets the cut (paper: half the budget).  The 95 % prediction band
    is the fit's bootstrap curves plus noise of sd sqrt(noise_sd^2 + drift_sd^2)
    (:meth:`scalectl.curve.SigmoidFit.band`): the evaluation noise seen in the
    fitted points, and the drift of a run away from its curve over the held-out
    stretch, which the fitted points cannot show (default :data:`DRIFT_SD`).  ``fit_kwargs`` go to
    :func:`scalectl.curve.fit_sigmoid` (min_compute, r0, method, bootstrap, ...).
    Returns an :class:`Extrapolation`.  Raises ValueError when no point lies past
    the cut, and :class:`FitError` when the prefix cannot be fitted.
    """
    x = np.asarray(compute, dtype=float)
    y = np.asarray(pass_rate, dtype=float)
    cut = cut_point(x, until, fraction)
    held = x > cut
    if not held.any():
        raise ValueError(f"no evaluation point lies past the cut at compute {cut:g} "
                         f"(last point at {x.max():g}): nothing to predict")
    trunc = fit_kwargs.pop("truncation", None)
    if trunc is not None:
        fit_kwargs["truncation"] = np.asarray(trunc, dtype=float)[~held]
    fit = fit_sigmoid(x[~held], y[~held], **fit_kwargs)
    hx, hy = x[held], y[held]
    pred = fit.predict(hx)
    err = np.abs(pred - hy)
    if fit.samples is not None and len(fit.samples):
        lo, hi = fit.band(hx, kind="prediction", drift_sd=drift_sd)
        share = float(np.mean((hy >= lo) & (hy <= hi)))
    else:
        lo, hi, share = np.array([]), np.array([]), None
    return Extrapolation(cut=cut, fit=fit, heldout_compute=hx, heldout_pass_rate=hy,
                         predicted=pred, band_lo=lo, band_hi=hi,
                         mean_abs_error=float(err.mean()), max_abs_error=float(err.max()),
                         share_in_band=share, drift_sd=drift_sd)


@dataclass(frozen=True)
class WindowFit:
    """The fit on one window (lo, hi) of compute, or the reason it failed."""

    window: tuple[float, float]
    fit: SigmoidFit | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"window": list(self.window), "fit": None if self.fit is None else self.fit.to_dict(),
                "error": self.error}


@dataclass(frozen=True)
class Sensitivity:
    """Fits of one run over several windows; ``A_spread`` = max A - min A over them."""

    rows: tuple[WindowFit, ...]

    @property
    def A_spread(self) -> float:
        a = [r.fit.A for r in self.rows if r.fit is not None]
        return float(max(a) - min(a)) if a else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows], "A_spread": self.A_spread}


def default_windows(compute: Sequence[float], min_compute: float) -> list[tuple[float, float]]:
    """Windows like the paper's A.7 table, for a run whose last point is M.

    (m, M), (0, M), (max(3m, 0.05 M), M) and (m, M/2), with m = ``min_compute``;
    duplicates dropped.  The paper's 100k run: 1.5k-100k, 0-100k, 5k-100k, 1.5k-50k.
    """
    M = float(np.max(compute))
    m = float(min_compute)
    out: list[tuple[float, float]] = []
    for w in ((m, M), (0.0, M), (max(3 * m, 0.05 * M), M), (m, M / 2)):
        if w not in out:
            out.append(w)
    return out


def window_sensitivity(compute: Sequence[float] | np.ndarray, pass_rate: Sequence[float] | np.ndarray,
                       windows: Sequence[tuple[float, float]] | None = None, *,
                       min_compute: float = 0.0, **fit_kwargs: Any) -> Sensitivity:
    """Fit each window (lo, hi): points with lo <= compute <= hi (plus those at compute 0 for R0).

    Default windows: :func:`default_windows`, less any that holds the same points as
    one before it (a short run's first point can lie past 0.05 M, so that (0.05 M, M)
    fits what (0, M) fits).  A window that cannot be fitted gives a row with ``error``
    instead of failing the whole table.
    """
    x = np.asarray(compute, dtype=float)
    y = np.asarray(pass_rate, dtype=float)
    rows, seen = [], set()
    for lo, hi in windows or default_windows(x, min_compute):
        keep = (x <= hi) | (x == 0)
        if windows is None:
            held = tuple(np.flatnonzero(((x >= lo) & (x > 0) & keep) | (x == 0)))
            if held in seen:
                continue
            seen.add(held)
        try:
            fit = fit_sigmoid(x[keep], y[keep], min_compute=lo, **fit_kwargs)
            rows.append(WindowFit((float(lo), float(hi)), fit))
        except FitError as e:
            rows.append(WindowFit((float(lo), float(hi)), None, str(e)))
    return Sensitivity(tuple(rows))
