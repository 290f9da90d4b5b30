"""The report of an ablation: figures, tables, HTML and Markdown.

The fits, verdicts and sentences come from
:func:`scalectl.ablation.analysis.gather`.  :func:`write_report` draws the figures
(:mod:`scalectl.present.plot`, plus truncation rates here) and writes a
self-contained HTML page (figures embedded as base64 PNG) and a Markdown
summary next to the PNG files.
"""

from __future__ import annotations

import base64
import html
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from scalectl.ablation.analysis import AblationResult, VariantResult
from scalectl.ablation.planner import format_value
from scalectl.science.compare import BASELINE
from scalectl.display import format_estimate

FIGURES = {"curves": "Pass rate against compute with the fitted sigmoids (grey band: the "
                      "baseline's ceiling +- the margin)",
           "loo": "Linearised curves with a shared ceiling (slope = B)",
           "truncation": "Truncation rate against compute"}


# --------------------------------------------------------------------------- figures


def draw_figures(result: AblationResult, out_dir: str | Path) -> dict[str, Path]:
    """Write curves.png, loo.png and truncation.png (those the data allow) into ``out_dir``."""
    from scalectl.present.plot import plot_curves, plot_loo, plot_truncation

    out_dir = Path(out_dir)
    fitted = {v.name: v.curve for v in result.variants if v.curve is not None}
    figs: dict[str, Path] = {}
    if fitted:
        base = result.baseline if result.baseline in fitted else None
        figs["curves"] = plot_curves(fitted, out_dir / "curves.png", baseline=base, margin=result.margin,
                                     title=f"{result.name}: pass rate against compute, fitted sigmoids, ceilings A")
    if result.loo and any(ln.log_c.size for ln in result.loo):
        figs["loo"] = plot_loo(result.loo, out_dir / "loo.png", axis=next(iter(fitted.values())).fit.axis,
                               fits={n: c.fit for n, c in fitted.items()}, margin=result.margin)
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
    lines = [f"kind: {result.kind}; baseline: {result.baseline}; margin on A: {result.margin:.3g}; "
             f"compute axis: {result.axis}"]
    if result.margin_source:
        lines.append(f"margin from {result.margin_source['where']}")
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


def build_report(db: str, manifest: dict, out_dir: str | Path, *, bootstrap: int = 1000,
                 margin: float | None = None) -> tuple[AblationResult, dict[str, Path]]:
    """Fit every variant of the ablation ``manifest`` from the store at ``db``
    (:func:`scalectl.ablation.analysis.gather`) and write its report into ``out_dir``
    (:func:`write_report`).  Returns (the result, the report's files by kind)."""
    from scalectl.ablation.analysis import gather
    from scalectl.store.journal import open_with_journals

    with open_with_journals(db) as store:
        result = gather(store, manifest, bootstrap=bootstrap, margin=margin)
    return result, write_report(result, out_dir)
