"""scripts/noise_from_runs.py: the seed-pair split of the noise, by hand on a real store."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import ROOT
from scalectl.store.database import Store


def _script():
    spec = importlib.util.spec_from_file_location("nfr", ROOT / "scripts" / "noise_from_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_seed_pairs_by_hand(tmp_path):
    nfr = _script()
    # 4 prompts x k = 2: each prompt all right or all wrong, so every evaluation has variance 0
    # except where one prompt is 1 of 2 (p = 1/2: 0.25 / 1 / 16 per evaluation).
    a_counts = [[2, 2, 0, 0], [2, 0, 0, 0]] * 3            # 0.50, 0.25, ...
    b_counts = [[2, 0, 0, 0]] * 6                          # 0.25 throughout
    half = [[2, 1, 0, 0]] * 6                              # 0.375, one prompt at 1/2
    with Store.open(tmp_path / "s.db") as store:
        ids = {}
        for name, h, counts in (("a", "h1", a_counts), ("b", "h1", b_counts), ("c", "h2", half),
                                ("d", "h2", half)):
            ids[name] = store.create_run(name, recipe_hash=h, seed=0, status="completed")
            store.add_points(ids[name], [{"step": 0, "pass_rate": 0.0, "samples_per_prompt": 2,
                                          "correct_counts": [0, 0, 0, 0]}]
                             + [{"step": 10 * (i + 1), "pass_rate": sum(c) / 8, "samples_per_prompt": 2,
                                 "correct_counts": c} for i, c in enumerate(counts)])
        pairs = {p["pair"]: p for p in nfr.seed_pairs(store, store.list_runs())}
    assert set(pairs) == {("a", "b"), ("c", "d")}          # runs pair up within a recipe hash only
    ab = pairs[("a", "b")]
    # d = +0.25, 0, ... (step 0 left out): mean 0.125, centred +-0.125
    assert ab["n"] == 6 and ab["offset"] == pytest.approx(0.125)
    assert ab["corr2"] == pytest.approx(0.125 ** 2 / 2) and ab["cov1"] == pytest.approx(-0.125 ** 2 / 2)
    assert ab["eval_sd"] == 0.0
    cd = pairs[("c", "d")]
    # identical points: no difference at all, so the correlated variance is minus the
    # evaluation variance (0.25 / (k - 1) / n^2 = 1/64 per run): the estimate can go negative
    assert cd["offset"] == 0.0 and cd["eval_sd"] == pytest.approx(1 / 8)
    assert cd["corr2"] == pytest.approx(-1 / 64) and cd["cov1"] == 0.0
