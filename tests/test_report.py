"""The ablation report: verdict sentences, and the report of imported synthetic
curves named as an ablation's runs (no training)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import run_cli
from scalectl.science.compare import FASTER, HIGHER, LOWER, SLOWER, SPEED_UNDECIDED, UNDECIDED, RunCurve, Row
from scalectl.curve import SigmoidFit
from scalectl.store.importer import import_points
from scalectl.ablation.analysis import VariantResult, sentence
from scalectl.ablation.report import md_escape
from scalectl.store.database import Store


def _fit(A: float, B: float = 2.0) -> SigmoidFit:
    return SigmoidFit(A=A, B=B, C_mid=2500.0, R0=0.3, r0_fitted=False, window=(100.0, 12500.0),
                      n_points=30, rmse=0.003, method="vp", intervals={"A": (A - 0.004, A + 0.004)})


def _variant(name: str, lead: str, A: float) -> VariantResult:
    fit = _fit(A)
    return VariantResult(name, False, lead, [], [], curve=RunCurve(np.array([1.0]), np.array([0.3]), fit))


def _row(name, A, verdict, reason="", d_iv=(-0.01, 0.01), shared=None, b_shared=None) -> Row:
    return Row(name=name, A=A, B=2.0, C_mid=2500.0, A_interval=(A - 0.004, A + 0.004), delta_A=A - 0.61,
               delta_A_interval=d_iv, verdict=verdict, reason=reason, shared_A=shared, B_shared=b_shared)


def test_sentences_per_verdict():
    base = _fit(0.61)
    v = _variant("loo-fp32", "Removing the FP32 head", 0.55)
    assert sentence(v, _row("loo-fp32", 0.55, LOWER), base, 0.02) == \
        "Removing the FP32 head lowered the ceiling from 0.61 to 0.55, beyond the 0.02 margin."
    v = _variant("gspo", "Changing loss.type from cispo to gspo", 0.64)
    assert sentence(v, _row("gspo", 0.64, HIGHER), base, 0.02) == \
        "Changing loss.type from cispo to gspo raised the ceiling from 0.61 to 0.64, beyond the 0.02 margin."
    # equal at two decimals: three are printed
    v = _variant("loo-plan", "Removing batch-level advantage normalization", 0.6064)
    reason = ("dA = -0.004 [-0.010, +0.002] within margin 0.020; with A = 0.608 shared: B 1.52 vs 2.01, "
              "C_mid 2611 vs 2490")
    assert sentence(v, _row("loo-plan", 0.6064, SLOWER, reason, shared=0.608, b_shared=1.52), base, 0.02) == (
        "Removing batch-level advantage normalization left the ceiling within the 0.02 margin "
        "(0.610 -> 0.606): a tie on ceiling, slower rise (with A shared at 0.608: B 1.52 vs 2.01, "
        "C_mid 2611 vs 2490).")
    v = _variant("pipe", "Changing async.mode from ppo_off_policy to pipeline", 0.62)
    s = sentence(v, _row("pipe", 0.62, FASTER, reason, shared=0.615, b_shared=2.4), base, 0.02)
    assert "a tie on ceiling, faster rise" in s and "(0.61 -> 0.62)" in s
    timed = Row(name="pipe", A=0.62, B=2.0, C_mid=2500.0, A_interval=(0.616, 0.624), delta_A=0.01,
                delta_A_interval=(-0.01, 0.01), verdict=FASTER, reason=reason, shared_A=0.615,
                speed_ratio=0.82, speed_interval=(0.74, 0.91))
    assert sentence(v, timed, base, 0.02).endswith(
        "a tie on ceiling, faster rise (it needs x0.82 [0.74, 0.91] of the baseline's compute to "
        "reach 80% of its rise).")
    tie = ("dA = +0.010 [-0.001, +0.019] within margin 0.020; compute to 80% of the rise: "
           "x0.97 [0.88, 1.07] of base's")
    assert sentence(v, _row("pipe", 0.62, SPEED_UNDECIDED, tie), base, 0.02) == (
        "Changing async.mode from ppo_off_policy to pipeline left the ceiling within the 0.02 margin "
        "(0.61 -> 0.62): a tie on ceiling; whether it rises faster is undecided (compute to 80% of "
        "the rise: x0.97 [0.88, 1.07] of base's).")
    v = _variant("x", "", 0.63)
    assert sentence(v, _row("x", 0.63, UNDECIDED, "dA straddles", d_iv=(-0.004, 0.044)), base, 0.02) == (
        "Variant x moved the ceiling from 0.61 to 0.63, but the interval of the difference "
        "[-0.004, +0.044] straddles the 0.02 margin: undecided (train longer or add seeds).")
    broken = VariantResult("y", False, "Removing y", [], [], error="no run")
    assert sentence(broken, None, base, 0.02) == "Removing y could not be judged: no run."


# --------------------------------------------------------------------------- imported curves

C_MID = 2500.0
#: variant -> (A, B, final truncation rate) of its synthetic curve; R0 = 0.30.
CURVES = {"base": (0.61, 2.0, 0.04), "loo-fp32": (0.55, 2.0, 0.05), "loo-plan": (0.61, 1.4, 0.04),
          "loo-lp": (0.60, 2.0, 0.14)}


def _write_curve(path, A, B, trunc_end, seed):
    rng = np.random.default_rng(seed)
    c = np.concatenate([[0.0], np.geomspace(100, 5 * C_MID, 40)])
    r = 0.30 + (A - 0.30) / (1 + (C_MID / np.maximum(c, 1e-9)) ** B)
    r[1:] += rng.normal(0, 0.003, c.size - 1)
    t = trunc_end * np.linspace(0.2, 1.0, c.size)
    lines = ["step,gpu_hours,pass_rate,truncation_rate"]
    lines += [f"{i},{ci:.3f},{ri:.5f},{ti:.4f}" for i, (ci, ri, ti) in enumerate(zip(c, r, t))]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    db = tmp / "s.db"
    with Store.open(db) as store:
        for i, (variant, (A, B, tr)) in enumerate(CURVES.items()):
            csv = tmp / f"{variant}.csv"
            _write_curve(csv, A, B, tr, seed=i)
            import_points(store, csv, f"scalerl-loo--{variant}--s0")
    return tmp, db


def test_report_of_an_ablation_file(imported):
    tmp, db = imported
    out = tmp / "out"
    proc = run_cli("report", "ablations/scalerl-loo.toml", "--out", str(out), "--runs-dir", str(tmp / "runs"),
                   "--bootstrap", "300", "--json", db=db)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    res = data["result"]
    rows = {r["name"]: r for r in res["comparison"]["rows"]}
    assert res["baseline"] == "base" and res["kind"] == "leave_one_out"
    fits = {v["name"]: v["fit"] for v in res["variants"]}
    for variant, (A, B, _) in CURVES.items():     # noise sd 0.003, data to 5 x C_mid: A within 0.01
        assert abs(fits[variant]["A"] - A) < 0.01, (variant, fits[variant])
    assert rows["loo-fp32"]["verdict"] == LOWER
    assert rows["loo-plan"]["verdict"] == SLOWER       # same A, B 1.4 against 2.0
    assert rows["loo-plan"]["B_shared"] < 1.6
    sentences = {v["name"]: v["sentence"] for v in res["variants"]}
    a_base, a_fp32 = fits["base"]["A"], fits["loo-fp32"]["A"]
    assert sentences["loo-fp32"] == (f"Removing the FP32 head lowered the ceiling from {a_base:.2f} to "
                                     f"{a_fp32:.2f}, beyond the 0.02 margin.")
    assert sentences["loo-plan"].startswith("Removing batch-level advantage normalization left the ceiling "
                                            "within the 0.02 margin") and "slower rise" in sentences["loo-plan"]
    # the truncation flag of the run whose truncation rate passes 0.10
    assert "truncation" in [f["code"] for f in fits["loo-lp"]["flags"]]
    assert "truncation" not in [f["code"] for f in fits["base"]["flags"]]
    # variants without runs are in the report, unjudged
    assert sentences["loo-dapo"] == "Removing the CISPO loss could not be judged: no run in the store."
    assert [r["status"] for r in next(v for v in res["variants"] if v["name"] == "loo-dapo")["runs"]] == ["missing"]

    page = (out / "index.html").read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 3                          # curves, leave-one-out lines, truncation
    import base64
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert "Removing the FP32 head lowered the ceiling" in page and "<script" not in page
    md = (out / "summary.md").read_text()
    assert md_escape(sentences["loo-fp32"]) in md
    assert re.search(r"!\[Pass rate against compute with the fitted sigmoids[^]]*\]\(curves.png\)", md)
    assert "| loo-fp32 | precision.lm_head fp32 -> bf16 |" in md
    for name in ("curves.png", "loo.png", "truncation.png"):
        assert (out / name).stat().st_size > 10_000


def test_report_by_name_without_manifest(imported):
    """Runs found by their names alone (no manifest, no file): the variant called base is the baseline."""
    from scalectl.ablation.campaign import find_manifest
    from scalectl.errors import UserError
    from scalectl.ablation.analysis import gather

    tmp, db = imported
    with Store.open(db) as store:
        manifest = find_manifest(store, "scalerl-loo", tmp / "runs")
        result = gather(store, manifest, bootstrap=0)
        with pytest.raises(UserError, match="no ablation 'no-such-ablation'"):
            find_manifest(store, "no-such-ablation", tmp / "runs")
    assert [v.name for v in result.variants] == ["base", "loo-fp32", "loo-plan", "loo-lp"]
    assert [v["runs"] for v in manifest["variants"]] == [[f"scalerl-loo--{v}--s0"] for v in CURVES]
    # no lead phrase without a plan; no bootstrap: the point estimates count as exact
    assert result.baseline == "base" and result.comparison.row("loo-fp32").verdict == LOWER
    assert result.variant("loo-fp32").sentence == \
        "Variant loo-fp32 lowered the ceiling from 0.61 to 0.55, beyond the 0.02 margin."


def test_seeds_of_a_variant_are_pooled(tmp_path):
    """Two seeds per variant: one fit on the pooled points for the verdict, and the
    per-seed fits for the spread of A."""
    from scalectl.ablation.analysis import gather

    db = tmp_path / "s.db"
    manifest = {"name": "two", "kind": "forward", "baseline": "base", "margin": 0.02, "variants": []}
    with Store.open(db) as store:
        for variant, A, lead in (("base", 0.61, ""), ("low", 0.55, "Changing x from a to b")):
            names = []
            for seed in (0, 1):
                csv = tmp_path / f"{variant}-{seed}.csv"
                _write_curve(csv, A, 2.0, 0.02, seed=10 * seed + len(variant))
                names.append(f"two--{variant}--s{seed}")
                import_points(store, csv, names[-1])
            manifest["variants"].append({"name": variant, "is_base": variant == "base", "lead": lead,
                                         "changes": [], "runs": names})
        result = gather(store, manifest, bootstrap=100)
    low = result.variant("low")
    assert low.curve.fit.n_points == 2 * 18              # 18 points past 1,500 GPU-hours per seed
    assert [f.n_points for f in low.seed_fits] == [18, 18]
    assert abs(low.curve.fit.A - 0.55) < 0.01
    assert result.comparison.row("low").verdict == LOWER
    assert low.sentence.startswith("Changing x from a to b lowered the ceiling from 0.61 to 0.55")


def test_an_unidentified_ceiling_is_not_reported_as_a_move():
    """At 1 x C_mid a variant's fit put A on its bound 1.0: the sentence said the variant 'moved the
    ceiling from 0.58 to 1.00'; it now says the verdict is undecided and why, and that the fitted
    ceilings are no difference yet."""
    base = _fit(0.58)
    v = _variant("fp32-off", "Switching from base to fp32-off", 1.0)
    why = ("ceiling of fp32-off not identified: A = 1.000 lies on the upper bound edge (1.000): the estimate "
           "is not trustworthy")
    s = sentence(v, _row("fp32-off", 1.0, UNDECIDED, why), base, 0.02)
    assert "moved the ceiling" not in s
    assert s == (f"Switching from base to fp32-off is undecided: {why} (the fitted ceilings, 0.58 and 1.00, are "
                 "not yet a difference: extend the runs).")
