"""The report of an ablation: fits, verdicts, figures, and a sentence per variant.

:func:`gather` reads an ablation's runs from the store and fits each variant
(the seeds of a variant pooled into one curve; each seed also fitted alone
to show the seed spread), then judges every variant against the baseline
with :func:`scalectl.compare.compare` (margin 0.02 by default: three seeds of
one recipe gave ceilings within +-0.015, Khatri et al. 2025, arXiv
2510.13786, section 3).  :func:`write_report` draws the figures
(:mod:`scalectl.plot`, plus truncation rates here) and writes a
self-contained HTML page (figures embedded as base64 PNG) and a Markdown
summary next to the PNG files.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from scalectl.ablation import format_value
from scalectl.compare import BASELINE, FASTER, HIGHER, LOWER, SLOWER, SPEED_UNDECIDED, Comparison, LooLine, RunCurve, Row
from scalectl.curve import SigmoidFit
from scalectl.display import format_estimate

DEFAULT_TRUNCATION_THRESHOLD = 0.10
FIGURES = {"curves": "Pass rate against compute with the fitted sigmoids (grey band: the "
                      "baseline's ceiling +- the margin)",
           "loo": "Linearised curves with a shared ceiling (slope = B)",
           "truncation": "Truncation rate against compute"}


@dataclass
class VariantResult:
    """One variant in the report.

    ``curve`` is the pooled fit over its seeds (None with ``error`` when it
    could not be fitted); ``seed_fits`` the per-seed fits when there are
    several; ``truncation`` one (compute (n,), truncation rate (n,)) pair per run.
    """

    name: str
    is_base: bool
    lead: str
    changes: list[tuple[str, Any, Any]]
    runs: list[dict]
    curve: RunCurve | None = None
    error: str | None = None
    seed_fits: list[SigmoidFit] = field(default_factory=list)
    truncation: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    sentence: str = ""


@dataclass
class AblationResult:
    """Everything the report shows; :func:`gather` builds it."""

    name: str
    kind: str
    description: str
    baseline: str
    margin: float
    axis: str
    plan: dict
    variants: list[VariantResult]
    comparison: Comparison | None = None
    loo: list[LooLine] | None = None
    loo_error: str | None = None
    truncation_threshold: float = DEFAULT_TRUNCATION_THRESHOLD
    notes: list[str] = field(default_factory=list)

    def variant(self, name: str) -> VariantResult:
        """The variant called ``name``.  Raises KeyError naming the known ones."""
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"no variant {name!r} (variants: {[v.name for v in self.variants]})")

    def to_dict(self) -> dict:
        """JSON-ready summary: fits, verdicts and sentences."""
        return {
            "name": self.name, "kind": self.kind, "baseline": self.baseline, "margin": self.margin,
            "axis": self.axis, "plan": self.plan, "notes": self.notes,
            "comparison": None if self.comparison is None else self.comparison.to_dict(),
            "variants": [{"name": v.name, "runs": v.runs, "error": v.error, "sentence": v.sentence,
                          "fit": None if v.curve is None else v.curve.fit.to_dict(),
                          "seed_fits": [f.to_dict() for f in v.seed_fits]} for v in self.variants],
        }


# --------------------------------------------------------------------------- gathering


def gather(store, manifest: dict, *, bootstrap: int = 1000, seed: int = 0, margin: float | None = None
           ) -> AblationResult:
    """Fit every variant of an ablation and compare them with the baseline.

    Args:
        store: an open :class:`scalectl.store.Store`.
        manifest: the ablation as :meth:`scalectl.ablation.Plan.to_dict` gives
            it, ``variants[i]["runs"]`` naming the stored runs of variant i.
        bootstrap: bootstrap resamples per fit (0: no intervals, and every
            comparison is undecided or decided on point values only).
        seed: bootstrap seed.
        margin: noise margin on A (default: the manifest's, else 0.02).

    Returns:
        The :class:`AblationResult`, sentences filled in.  Variants without
        runs, points or a fit carry an ``error`` instead of a curve.
    """
    from scalectl import compare as cmp
    from scalectl.run_fits import FitOptions, fit_run, load_points
    from scalectl.curve import FitError, default_min_compute, fit_sigmoid
    from scalectl.errors import UserError

    margin = float(margin if margin is not None else manifest.get("margin", 0.02))
    opts = FitOptions(bootstrap=bootstrap, seed=seed)
    variants, axes, thresholds = [], set(), []
    for v in manifest["variants"]:
        res = VariantResult(v["name"], bool(v.get("is_base")), v.get("lead", ""),
                            [tuple(c) for c in v.get("changes", [])], [])
        curves = []
        for ref in v.get("runs", []):
            try:
                run = store.get_run(ref)
            except UserError:
                res.runs.append({"name": ref, "status": "missing", "points": 0})
                continue
            pts = store.points(run["id"])
            res.runs.append({"name": run["name"], "status": run["status"], "seed": run.get("seed"),
                             "points": len(pts)})
            section = (run.get("recipe") or {}).get("fit") or {}
            thresholds.append(float(section.get("truncation_threshold", DEFAULT_TRUNCATION_THRESHOLD)))
            if not pts:
                continue
            try:
                curve = fit_run(store, run, opts)[0]
                x, _, t = load_points(store, run, curve.fit.axis)
            except UserError as exc:
                res.error = str(exc)
                continue
            curves.append((curve, section))
            res.truncation.append((x, t))
        if not curves:
            missing = all(r["status"] == "missing" for r in res.runs)
            res.error = res.error or ("no run in the store" if missing else "no evaluation points yet")
        elif len(curves) == 1:
            res.curve = curves[0][0]
        else:
            res.seed_fits = [c.fit for c, _ in curves]
            axis = curves[0][0].fit.axis
            x = np.concatenate([c.compute for c, _ in curves])
            y = np.concatenate([c.pass_rate for c, _ in curves])
            section = curves[0][1]
            min_c = (float(section["min_compute"]) if "min_compute" in section
                     and section.get("axis", "gpu_hours") == axis else default_min_compute(x, axis))
            try:
                fit = fit_sigmoid(x, y, min_compute=min_c, axis=axis, bootstrap=bootstrap, seed=seed,
                                  truncation=np.concatenate([t for _, t in res.truncation]),
                                  truncation_threshold=thresholds[-1])
                res.curve = RunCurve(x, y, fit, curves[0][0].hardware)
            except (FitError, ValueError) as exc:
                res.error = f"pooled fit of {len(curves)} seeds: {exc}"
        if res.curve is not None:
            axes.add(res.curve.fit.axis)
        variants.append(res)

    baseline = manifest.get("baseline") or variants[0].name
    result = AblationResult(
        name=manifest["name"], kind=manifest.get("kind", "unknown"),
        description=manifest.get("description", ""), baseline=baseline, margin=margin,
        axis=", ".join(sorted(axes)) or "-", plan=manifest, variants=variants,
        truncation_threshold=max(thresholds) if thresholds else DEFAULT_TRUNCATION_THRESHOLD,
        notes=list(manifest.get("notes", [])))
    fitted = {v.name: v.curve for v in variants if v.curve is not None}
    base = next((v for v in variants if v.name == baseline), None)
    if base is None or base.curve is None:
        result.notes.append(f"the baseline {baseline} has no fit ({base.error if base else 'not in the ablation'}): "
                            "no verdicts")
    else:
        result.comparison = cmp.compare(fitted, baseline=baseline, margin=margin)
    if len(fitted) >= 2:
        try:
            result.loo = cmp.loo_lines(fitted)
        except (FitError, ValueError) as exc:
            result.loo_error = str(exc)
    for v in variants:
        row = None
        if result.comparison is not None and v.curve is not None:
            row = result.comparison.row(v.name)
        v.sentence = sentence(v, row, None if base is None or base.curve is None else base.curve.fit,
                              margin)
    return result


# --------------------------------------------------------------------------- words


def _pair(a: float, b: float) -> tuple[str, str]:
    """Two ceilings to two decimals, or three when two would print them equal."""
    x, y = f"{a:.2f}", f"{b:.2f}"
    return (x, y) if x != y else (f"{a:.3f}", f"{b:.3f}")


def sentence(v: VariantResult, row: Row | None, base_fit: SigmoidFit | None, margin: float) -> str:
    """One plain sentence on a variant's verdict against the baseline, e.g.
    "Removing the FP32 head lowered the ceiling from 0.61 to 0.55, beyond the
    0.02 margin."  (verdict rules: :mod:`scalectl.compare`)."""
    subject = v.lead or f"Variant {v.name}"
    if v.is_base or (row is not None and row.verdict == BASELINE):
        if v.curve is None:
            return f"{v.name} is the baseline; it could not be fitted: {v.error}."
        f = v.curve.fit
        return (f"{v.name} is the baseline: ceiling A {format_estimate(f.A, f.interval('A'))}, "
                f"B {f.B:.2f}, C_mid {f.C_mid:.4g}.")
    if v.curve is None:
        return f"{subject} could not be judged: {v.error}."
    if row is None or base_fit is None:
        return f"{subject} could not be judged: the baseline has no fit."
    old, new = _pair(base_fit.A, row.A)
    lo, hi = row.delta_A_interval
    m = f"{margin:g}"
    if row.verdict == HIGHER:
        return f"{subject} raised the ceiling from {old} to {new}, beyond the {m} margin."
    if row.verdict == LOWER:
        return f"{subject} lowered the ceiling from {old} to {new}, beyond the {m} margin."
    if row.verdict in (FASTER, SLOWER):
        speed = "faster" if row.verdict == FASTER else "slower"
        b = "" if row.shared_A is None else f" (with A shared at {row.shared_A:.3f}: {row.reason.split('shared: ', 1)[-1]})"
        if row.speed_interval is not None:
            lo_s, hi_s = row.speed_interval
            b = (f" (it needs x{row.speed_ratio:.2f} [{lo_s:.2f}, {hi_s:.2f}] of the baseline's compute "
                 "to reach 80% of its rise)")
        return (f"{subject} left the ceiling within the {m} margin ({old} -> {new}): "
                f"a tie on ceiling, {speed} rise{b}.")
    if row.verdict == SPEED_UNDECIDED:
        return (f"{subject} left the ceiling within the {m} margin ({old} -> {new}): a tie on "
                f"ceiling; whether it rises faster is undecided ({row.reason.split('; ', 1)[-1]}).")
    if "not identified" in row.reason:
        return f"{subject} moved the ceiling from {old} to {new}, but it is undecided: {row.reason}."
    return (f"{subject} moved the ceiling from {old} to {new}, but the interval of the difference "
            f"[{lo:+.3f}, {hi:+.3f}] straddles the {m} margin: undecided (train longer or add seeds).")


# --------------------------------------------------------------------------- figures


def plot_truncation(series: dict[str, list[tuple[np.ndarray, np.ndarray]]], path: str | Path, *,
                    axis: str = "gpu_hours", threshold: float = DEFAULT_TRUNCATION_THRESHOLD) -> Path:
    """Truncation rate (share of completions cut at the length limit) against
    compute, one colour per variant (one line per seed), with the flag
    threshold (method.md section 5: runs past 10-15% became unstable)."""
    from scalectl.plot import _COLORS, _new_figure, _save, AXIS_LABELS

    fig = _new_figure((7.5, 4.0))
    ax = fig.add_subplot()
    for i, (name, runs) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        for j, (x, t) in enumerate(runs):
            ok = np.isfinite(t) & (x > 0)
            ax.plot(x[ok], t[ok], "o-", ms=3, lw=1.2, color=color, alpha=0.85,
                    label=name if j == 0 else None)
    ax.axhline(threshold, color="black", ls=":", lw=1, label=f"flag threshold {threshold:g}")
    ax.set_xscale("log")
    ax.set_xlabel(AXIS_LABELS.get(axis, axis))
    ax.set_ylabel("truncation rate")
    ax.set_ylim(bottom=0)
    ax.set_title("Truncation rate against compute")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


def draw_figures(result: AblationResult, out_dir: str | Path) -> dict[str, Path]:
    """Write curves.png, loo.png and truncation.png (those the data allow) into ``out_dir``."""
    from scalectl.plot import plot_curves, plot_loo

    out_dir = Path(out_dir)
    fitted = {v.name: v.curve for v in result.variants if v.curve is not None}
    figs: dict[str, Path] = {}
    if fitted:
        base = result.baseline if result.baseline in fitted else None
        figs["curves"] = plot_curves(fitted, out_dir / "curves.png", baseline=base, margin=result.margin,
                                     title=f"{result.name}: pass rate against compute (dashed: ceiling A)")
    if result.loo and any(ln.log_c.size for ln in result.loo):
        figs["loo"] = plot_loo(result.loo, out_dir / "loo.png", axis=next(iter(fitted.values())).fit.axis)
    trunc = {v.name: v.truncation for v in result.variants if v.truncation}
    if trunc and any(np.isfinite(t).any() for runs in trunc.values() for _, t in runs):
        figs["truncation"] = plot_truncation(trunc, out_dir / "truncation.png",
                                             axis=next(iter(fitted.values())).fit.axis if fitted else "gpu_hours",
                                             threshold=result.truncation_threshold)
    return figs


# --------------------------------------------------------------------------- text


def _changes(v: VariantResult) -> str:
    if v.is_base:
        return "(baseline)"
    return "; ".join(f"{k} {format_value(a)} -> {format_value(b)}" for k, a, b in v.changes) or "-"


def _fit_cells(v: VariantResult) -> list[str]:
    if v.curve is None:
        return ["-"] * 5 + [v.error or "-"]
    f = v.curve.fit
    est = lambda n: format_estimate(getattr(f, n), f.interval(n))  # noqa: E731
    return [est("A"), est("B"), est("C_mid"), f"{f.R0:.3f}" + (" fit" if f.r0_fitted else ""),
            str(f.n_points), ", ".join(dict.fromkeys(f.flag_codes)) or "-"]


def _seed_cell(v: VariantResult) -> str:
    if len(v.seed_fits) < 2:
        return "-"
    a = np.array([f.A for f in v.seed_fits])
    return f"A {a.mean():.3f} +- {a.std(ddof=1):.3f} over {a.size} seeds"


def _verdict_cells(result: AblationResult, v: VariantResult) -> list[str]:
    if result.comparison is None or v.curve is None:
        return ["-", "-", "-"]
    row = result.comparison.row(v.name)
    if row.verdict == BASELINE:
        return ["-", BASELINE, ""]
    lo, hi = row.delta_A_interval
    return [f"{row.delta_A:+.3f} [{lo:+.3f}, {hi:+.3f}]", row.verdict, row.reason]


def tables(result: AblationResult) -> dict[str, tuple[list[str], list[list[str]]]]:
    """The report's tables as (header, rows) of strings: plan, fits, verdicts."""
    plan = (["variant", "changes from the baseline", "runs (status, points)"],
            [[v.name, _changes(v), ", ".join(f"{r['name']} ({r['status']}, {r['points']})" for r in v.runs)
              or "-"] for v in result.variants])
    fits = (["variant", "A", "B", "C_mid", "R0", "points", "flags / error", "seed spread"],
            [[v.name, *_fit_cells(v), _seed_cell(v)] for v in result.variants])
    verdicts = (["variant", "dA [interval]", "verdict", "reason"],
                [[v.name, *_verdict_cells(result, v)] for v in result.variants])
    return {"plan": plan, "fits": fits, "verdicts": verdicts}


def _flag_lines(result: AblationResult) -> list[str]:
    lines = []
    for v in result.variants:
        if v.curve is not None:
            lines += [f"{v.name}: {f.code}: {f.message}" for f in v.curve.fit.flags]
    if result.comparison is not None:
        lines += [f"{f.code}: {f.message}" for f in result.comparison.flags]
    return lines


def _header_lines(result: AblationResult) -> list[str]:
    p = result.plan
    lines = [f"kind: {result.kind}; baseline: {result.baseline}; margin on A: {result.margin:g}; "
             f"compute axis: {result.axis}"]
    if p.get("base") or p.get("setup"):
        lines.append(f"base recipe: {p.get('base') or '-'}; setup: {p.get('setup') or '-'}")
    if p.get("overrides"):
        lines.append("overrides on every run: " + ", ".join(p["overrides"]))
    return lines + result.notes


#: Characters CommonMark could read as markup in user text: HTML tags and entities, links and
#: images, code, emphasis, table cells, headings.
_MD_SPECIAL = re.compile(r"([\\`*\[\]<&|#])")


def md_escape(text: object, *, inline: bool = True) -> str:
    """``text`` shown verbatim in Markdown: markup characters backslash-escaped
    (CommonMark section 2.4), newlines made spaces when ``inline``.  Recipe
    descriptions, ``--set`` values and errors go through it, as the HTML
    report passes them through ``html.escape``."""
    out = _MD_SPECIAL.sub(r"\\\1", str(text))
    return out.replace("\r", " ").replace("\n", " ") if inline else out


def render_markdown(result: AblationResult, figures: dict[str, Path]) -> str:
    """The Markdown summary; figures linked by file name (they sit beside it).
    Every text that comes from the user is escaped (:func:`md_escape`)."""
    def table(header, rows):
        return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                         + ["| " + " | ".join(md_escape(c) for c in r) + " |" for r in rows])

    t = tables(result)
    parts = [f"# Ablation {md_escape(result.name)}", ""]
    if result.description:
        parts += [md_escape(result.description, inline=False), ""]
    parts += [f"- {md_escape(line)}" for line in _header_lines(result)] + ["", "## In words", ""]
    parts += [f"- {md_escape(v.sentence)}" for v in result.variants] + ["", "## Plan", "", table(*t["plan"]), "",
                                                             "## Fits", "", table(*t["fits"]), "",
                                                             "## Verdicts", "", table(*t["verdicts"]), ""]
    flags = _flag_lines(result)
    if flags:
        parts += ["## Flags", ""] + [f"- {md_escape(line)}" for line in flags] + [""]
    if figures:
        parts += ["## Figures", ""] + [f"![{FIGURES[k]}]({p.name})" for k, p in figures.items()] + [""]
    if result.loo_error:
        parts += [f"(no leave-one-out plot: {md_escape(result.loo_error)})", ""]
    return "\n".join(parts)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:0.9em}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}
.flags li{color:#8a5a00}figure{margin:1em 0}figcaption{font-size:0.9em;color:#555}"""


def render_html(result: AblationResult, figures: dict[str, Path]) -> str:
    """A self-contained HTML page: every figure embedded as a base64 PNG."""
    e = html.escape

    def table(header, rows):
        head = "".join(f"<th>{e(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    t = tables(result)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Ablation {e(result.name)}</title>"
             f"<style>{_CSS}</style></head><body>", f"<h1>Ablation {e(result.name)}</h1>"]
    if result.description:
        parts.append(f"<p>{e(result.description)}</p>")
    parts.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in _header_lines(result))
                 + f"<li>written {e(stamp)}</li></ul>")
    parts.append("<h2>In words</h2><ul>" + "".join(f"<li>{e(v.sentence)}</li>" for v in result.variants)
                 + "</ul>")
    for key, caption in FIGURES.items():
        if key in figures:
            data = base64.b64encode(Path(figures[key]).read_bytes()).decode("ascii")
            parts.append(f"<figure><img alt='{e(caption)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{e(caption)}</figcaption></figure>")
    if result.loo_error:
        parts.append(f"<p>No leave-one-out plot: {e(result.loo_error)}</p>")
    parts += ["<h2>Plan</h2>", table(*t["plan"]), "<h2>Fits</h2>", table(*t["fits"]),
              "<h2>Verdicts</h2>", table(*t["verdicts"])]
    flags = _flag_lines(result)
    if flags:
        parts.append("<h2>Flags</h2><ul class='flags'>" + "".join(f"<li>{e(x)}</li>" for x in flags) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(result: AblationResult, out_dir: str | Path) -> dict[str, Path]:
    """Draw the figures and write ``index.html`` and ``summary.md`` into ``out_dir``.

    Returns:
        name -> path of every file written (html, markdown, and each figure).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = draw_figures(result, out_dir)
    html_path = out_dir / "index.html"
    md_path = out_dir / "summary.md"
    html_path.write_text(render_html(result, figures))
    md_path.write_text(render_markdown(result, figures))
    return {"html": html_path, "markdown": md_path, **figures}
